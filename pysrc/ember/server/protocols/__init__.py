"""Each API the server speaks, one module apiece: it maps its requests to
the chat core's and the engine's terms, renders what they give back in its
own shape, names fields its own way and answers in its own error envelope
(its `ENVELOPES`: path prefix -> `ember.server.http.Envelope`; llama-server's
where it has none). `PROTOCOLS` is the registry `ember.server.app` mounts; a
new API is a module here and a line there."""

from ember.server.protocols import anthropic, embeddings, llama_server, ollama, openai, responses, vertex

#: In the order their routes are added (Vertex AI's last: its instances name the others).
PROTOCOLS = (openai, anthropic, responses, embeddings, ollama, llama_server, vertex)

__all__ = ["PROTOCOLS"]
