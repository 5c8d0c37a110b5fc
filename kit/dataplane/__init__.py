"""What runs inside the stack: the door's njs, the collector, the waker, the weights fetcher."""
