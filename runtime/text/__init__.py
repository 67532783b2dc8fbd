"""Text: the tokenizer (and its cache of tokenizers converted from GGUF files), the chat template and its
budgeted renderer, and the detokenizer; the engine and the frontend use it, the workers do not."""
