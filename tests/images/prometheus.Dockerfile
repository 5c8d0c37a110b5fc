# Prometheus 3.5 (Debian forky's prometheus + promtool binaries, unpacked by prometheus.sh) laid out
# like the official image: ENTRYPOINT /bin/prometheus, user nobody, data in /prometheus.
# Built by tests/images/build.sh; never pulls.
ARG BASE
FROM ${BASE}
COPY prometheus promtool /usr/bin/
RUN mkdir -p /prometheus /etc/prometheus && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
