"""Running steps: the model runner, its decode fast path, CUDA graphs, and the draft-model proposer."""
