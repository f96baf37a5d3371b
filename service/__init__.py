"""OpenAI protocol over HTTP: request models, routes, SSE, errors, auth, metrics. Never touches tensors."""
