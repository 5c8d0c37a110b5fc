# A TEST STAND-IN tagged with the pinned Grafana image name (NOT Grafana: it has no Debian
# package and no registry is reachable). Built by tests/images/build.sh; never pulls.
ARG BASE
FROM ${BASE}
COPY grafana_standin.py /opt/kit-grafana-standin/grafana_standin.py
LABEL kit.test.standin="grafana: NOT Grafana, see tests/images/grafana-standin"
EXPOSE 3000
STOPSIGNAL SIGINT
ENTRYPOINT ["python3", "/opt/kit-grafana-standin/grafana_standin.py"]
