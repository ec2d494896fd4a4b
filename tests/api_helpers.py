"""What the server's tests in several files share: the conversation they
send, the model alias and chat template the flags server
(tests/server/conftest.py's `flags_server`) is started with, and the FIM tokens
of the `smollm2_fim_path` copy."""

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
TEMPLATE = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}"
ALIAS = "my-alias"
#: Unused control tokens of SmolLM2's vocabulary that the `smollm2_fim_path`
#: copy's metadata names as fill-in-the-middle tokens (its `<reponame>`, id 4,
#: is FIM_REP by spelling).
SMOLLM2_FIM_IDS = {"fim_pre": 3, "fim_suf": 5, "fim_mid": 6, "fim_sep": 8}


def openai_client(server, key: str = "unused"):
    """The official client pointed at a test server, without retries (a
    refusal is the test's to see)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
