# Alertmanager 0.33.1 (Debian forky's prometheus-alertmanager binaries, unpacked by
# `prometheus.sh alertmanager`) laid out like the official image: ENTRYPOINT /bin/alertmanager,
# amtool beside it, user nobody, data in /alertmanager; Debian's build reads its notification
# templates from /usr/share/prometheus/alertmanager (the official one embeds them). Built by
# tests/images/build.sh; never pulls.
ARG BASE
FROM ${BASE}
COPY prometheus-alertmanager /bin/alertmanager
COPY amtool /bin/amtool
COPY share /usr/share/prometheus/alertmanager
RUN mkdir -p /alertmanager /etc/alertmanager && chown 65534:65534 /alertmanager
USER 65534:65534
WORKDIR /alertmanager
EXPOSE 9093
ENTRYPOINT ["/bin/alertmanager"]
CMD ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]
