"""The batched decode loop: model, batch and sampler. Knows nothing about HTTP."""
