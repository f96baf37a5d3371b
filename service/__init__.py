"""OpenAI protocol over HTTP: request models, routes, SSE, errors, auth, metrics. Never touches tensors.

Modules: protocol (request models and ranges), errors (OpenAI error shape), auth (bearer key), limits (body
size), chat_template (messages -> prompt), prompts (completion prompt shapes, context rule), sampling (fields ->
SamplingParams), generation (plan, compile, run and cancel engine requests), responses (JSON bodies, logprobs
shapes), fingerprint (system_fingerprint), sse (stream chunks), tool_stream (tool calls as streamed deltas),
metrics (Prometheus), routes, app, config (the server's settings), cli (the `structgen` command), server
(start-up and uvicorn).

Beyond OpenAI, documented for clients:
- Request fields `regex` (a pattern) and `choice` (a list of strings) constrain the output; `response_format`
  also takes `{"type": "json_object", "schema": {...}}`; chat also takes a raw `prompt` instead of `messages`.
- Request field `constraint_backend` (`auto`, `outlines`, `llguidance`) overrides the server's choice for one
  request; response header `x-structgen-constraint-backend` names the backend that served the constraint
  (`llguidance+outlines`: its parts were served by both).
- Response header `x-structgen-ignored-fields`: unknown request fields, comma-separated (accepted, ignored; a
  message's as `messages.N.field`, likewise `stream_options.field`, `tools.N.field`, `tools.N.function.field`;
  one that several messages carry as `messages.*.field`; past 2,000 characters the list ends `+N more`).
- Response header `x-structgen-unenforced`: JSON Pointers of schema keywords accepted but not enforced
  (non-strict schemas only; strict ones with such keywords are a 400). Both lists percent-encode what a header
  cannot carry (`generation.header_list`).
- Streamed errors after the first byte arrive as `data: {"error": {...}}` followed by `data: [DONE]`.
- `return_tokens_as_token_ids`: logprobs tokens are written `token_id:<id>`.
"""
