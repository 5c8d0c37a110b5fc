"""The plan written as files: compose, nginx, Prometheus, Grafana, worker nodes, Kubernetes."""
