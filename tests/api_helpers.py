"""What the server's tests in several files share: the conversation they
send, and the model alias and chat template the flags server
(tests/server/conftest.py's `flags_server`) is started with."""

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
TEMPLATE = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}"
ALIAS = "my-alias"


def openai_client(server, key: str = "unused"):
    """The official client pointed at a test server, without retries (a
    refusal is the test's to see)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
