"""`schedlab serve`: an OpenAI-compatible streaming HTTP server over the engine, and
`schedlab bench serve`, a client that replays a workload against any such server.

- `loop`: the one background thread that owns the engine; requests in, tokens out per step;
- `clock`: real-time pacing of a simulated engine (`executor=sim`);
- `text`: incremental detokenization and stop strings;
- `protocol`: the request bodies (strict pydantic) and OpenAI-shaped responses and errors;
- `prepare`: a body's bytes to a checked, tokenized request (in a worker thread);
- `app`: the FastAPI app; `server`: uvicorn with a draining SIGINT/SIGTERM;
- `prom`: the Prometheus metrics (`schedlab:` names after vLLM's `vllm:` ones);
- `bench`: the HTTP load client.
"""
