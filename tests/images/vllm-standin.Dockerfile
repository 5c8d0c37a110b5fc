# The vLLM stand-in image (NOT vLLM: tests/standin imitates vLLM 0.33.0's CLI and HTTP surface).
# Built by tests/images/build.sh from a local Debian base image; never pulls anything.
ARG BASE
FROM ${BASE}
COPY standin/ /opt/vllm-standin/
COPY bin/ /usr/local/bin/
# huggingface_hub and its dependencies, where vLLM's image has them: its Python's dist-packages
# (build.sh unpacks the wheels; kit pull through a remote engine runs kit's fetcher with them).
COPY site-packages/ /usr/local/lib/python3.11/dist-packages/
WORKDIR /vllm-workspace
EXPOSE 8000
# Like vllm/vllm-openai: compose `command:` is appended to `vllm serve`.
ENTRYPOINT ["vllm", "serve"]
