"""A vLLM stand-in for tests. It is NOT vLLM.

It imitates the command line (`vllm serve` of vLLM 0.33.0, parsed from the real option list), the
start-up log and start-up failures, and the HTTP surface (OpenAI-compatible endpoints, SSE bytes,
/metrics) that vLLM shows, so kit's end-to-end tests can run a real compose stack on machines
without a GPU. No model is loaded and the generated text is meaningless. See README.md.
"""

VERSION = "0.33.0"
