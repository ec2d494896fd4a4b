"""Token ids llama.cpp gives a fixed set of awkward strings, for every
pre-tokenizer ember implements (on SmolLM2's vocabulary with the
`tokenizer.ggml.pre` key swapped) and for Gemma 3's SentencePiece vocabulary.

    python make_llama_cpp_fuzz.py MODELS_DIR OUT.json

Needs llama-cpp-python (made with 0.3.36, the version tests/golden was made
with). Ids are stored as FNV-1a 64 hashes of their little-endian u32 bytes to
keep the file small; the Rust test prints its own ids on a mismatch.
"""
import json
import os
import random
import struct
import sys
import tempfile

import llama_cpp as L

PRES = [
    "default", "llama-bpe", "dbrx", "chatglm-bpe", "glm5", "deepseek-llm", "deepseek-coder", "deepseek-v3",
    "spark2_5", "youtu", "falcon", "gpt-2", "jais-2", "starcoder", "smollm", "command-r", "qwen2", "stablelm2",
    "qwen35", "bloom", "poro-chat", "viking", "tekken", "chameleon", "gpt-4o", "granite-embed-multi-97m",
    "tiny_aya", "bailingmoe", "seed-coder", "ufakzeka", "grok-2", "afmoe", "laguna", "exaone-moe", "minicpm5",
]


def strings(n):
    rnd = random.Random(20240611)
    words = ["hello", "World", "don't", "I'M", "they'll", "we've", "it's", "x", "ABC", "camelCase", "snake_case",
             "naïve", "Straße", "ÉCOLE", "a", "I", "'s", "'re", "'LL", "ﬁ"]
    nums = ["1", "12", "123", "1234", "1234567", "3.14", "1,000", "-42", "1e10", "０１２", "٣٤", "½", "²", "Ⅻ", "𝟙"]
    ws = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\n\n\n", " \n ", "\u00a0", "\u3000", "\u2003", "\u200b",
          "\u0085", "\u000b", "\u000c", "\r", " \t ", "    "]
    punct = list("!?.,;:-_()[]{}<>#$%^&*|~`@\\/+=\"'") + ["...", "--", "''", "<<", ">>", "->", "=>", "!!", "?!"]
    uni = ["é", "e\u0301", "日本語", "中文", "测试", "한국어", "Ελληνικά", "русский", "عربى", "हिन्दी", "ไทย", "😀",
           "👍🏽", "👨‍👩‍👧", "𝔘𝔫𝔦", "\ufffd", "\u0007", "\u0001", "ｱｲｳ", "ａｂｃ", "ß", "ǅ", "ʰ", "々", "〇", "ー",
           "\u0301", "\u200d", "\ufeff", "\U0010fffd", "\u2581", "▁▁x"]
    special = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
               "<unused5>", "[multimodal]", "<pad>", "<mask>", "<repo_name>", "<reponame>", "<|im_start", "im_end|>",
               "<0x41>", "<unk>", "</s>", "<s>", "<table>", "<br>", "</div>", "<start_of_image>"]
    pools = [words, nums, ws, punct, uni, special]
    out = []
    for _ in range(n):
        s = ""
        for _ in range(rnd.randint(1, 14)):
            s += rnd.choice(rnd.choice(pools))
            if rnd.random() < 0.4:
                s += rnd.choice([" ", "", "", "\n", "  "])
        out.append(s)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF), (0x1F300, 0x1F64F), (0x2000, 0x206F), (0x0, 0x1F),
              (0x300, 0x36F)]
    for _ in range(n // 4):
        s = "".join(chr(rnd.randint(*rnd.choice(ranges))) for _ in range(rnd.randint(1, 30)))
        out.append(s)
    out += [" ", "\n", " " * 40, "\n" * 40, "a" * 300, "1" * 50, "'s'S'm't", "x     y", "\t\t\tx"]
    return out


def fnv(ids):
    h = 0xCBF29CE484222325
    for b in struct.pack("<%dI" % len(ids), *ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def read_kvs(path):
    """The metadata entries of a GGUF file as raw (key, bytes) pairs."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    f = open(path, "rb")
    rd = lambda fmt: struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))
    def skip(t):
        if t in sizes:
            f.read(sizes[t])
        elif t == 8:
            f.read(rd("Q")[0])
        else:
            et, n = rd("I")[0], rd("Q")[0]
            if et in sizes:
                f.read(sizes[et] * n)
            else:
                for _ in range(n):
                    skip(et)
    assert f.read(4) == b"GGUF"
    ver, _, nkv = rd("I")[0], rd("Q")[0], rd("Q")[0]
    kvs = []
    for _ in range(nkv):
        key = f.read(rd("Q")[0]).decode()
        t = rd("I")[0]
        at = f.tell()
        skip(t)
        end = f.tell()
        f.seek(at)
        kvs.append((key, struct.pack("<I", t) + f.read(end - at)))
    return ver, kvs


def write_variant(ver, kvs, overrides, path):
    enc = lambda b: struct.pack("<Q", len(b)) + b
    out = [enc(k.encode()) + v for k, v in kvs if k not in overrides]
    for k, v in overrides.items():
        if isinstance(v, bool):
            out.append(enc(k.encode()) + struct.pack("<IB", 7, v))
        else:
            out.append(enc(k.encode()) + struct.pack("<I", 8) + enc(v.encode()))
    with open(path, "wb") as g:
        g.write(b"GGUF" + struct.pack("<IQQ", ver, 0, len(out)) + b"".join(out))


class Vocab:
    def __init__(self, path):
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(path.encode(), mp)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.buf = (L.llama_token * (1 << 16))()

    def tokenize(self, s, add_special, parse_special):
        b = s.encode()
        n = L.llama_tokenize(self.vocab, b, len(b), self.buf, len(self.buf), add_special, parse_special)
        assert n >= 0
        return list(self.buf[:n])

    def close(self):
        L.llama_model_free(self.model)


def main(models, out_path):
    L.llama_backend_init()
    texts = strings(240)
    out = {"made_with": "llama-cpp-python %s" % L.__version__, "strings": texts, "bpe": {}, "spm": {}}
    tmp = tempfile.mkdtemp()
    ver, kvs = read_kvs(os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    for pre in PRES:
        p = os.path.join(tmp, pre + ".gguf")
        write_variant(ver, kvs, {"tokenizer.ggml.pre": pre}, p)
        v = Vocab(p)
        out["bpe"][pre] = [fnv(v.tokenize(s, False, False)) for s in texts]
        v.close()
    ver, kvs = read_kvs(os.path.join(models, "gemma-3-270m-q4_k_m.gguf"))
    for name, prefix in [("gemma3", False), ("gemma3+space_prefix", True)]:
        p = os.path.join(tmp, name + ".gguf")
        write_variant(ver, kvs, {"tokenizer.ggml.add_space_prefix": prefix}, p)
        v = Vocab(p)
        out["spm"][name] = {
            "plain": [fnv(v.tokenize(s, False, False)) for s in texts],
            "special": [fnv(v.tokenize(s, True, True)) for s in texts],
        }
        v.close()
    json.dump(out, open(out_path, "w"), ensure_ascii=False, indent=0)


main(sys.argv[1], sys.argv[2])
