"""kit's data plane: the programs that run inside the stack (the door's njs, the usage ledger's
collector, the waker, the weights fetcher, the door's request counter). Each imports nothing of
kit's outside its own sub-package: it runs in a container (nginx's njs, or the python3 of the
vLLM image)."""
