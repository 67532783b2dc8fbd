"""The OpenAI-compatible HTTP frontend: request schemas, completion and chat serving, errors, metrics."""
