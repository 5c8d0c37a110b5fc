"""A multi-node service's worker nodes: the converge run on each node's engine, checked
across the nodes first."""
