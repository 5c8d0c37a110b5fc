"""kit bench: the load client, the run against a live site, the analysis and the report."""
