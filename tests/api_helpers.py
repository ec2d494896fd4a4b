"""What the server's tests in several files share: the conversation they
send, and the model alias and chat template the flags server
(tests/server/conftest.py's `flags_server`) is started with."""

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
TEMPLATE = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}"
ALIAS = "my-alias"
