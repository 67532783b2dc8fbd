"""How actors talk: the wire types, their codec, and the retained-send FIFO for buffers in flight."""
