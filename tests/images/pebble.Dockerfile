# Let's Encrypt's ACME test server (Debian's pebble 2.4) with its mock DNS (pebble-challtestsrv):
# the site's domain resolves to CHALLTESTSRV_IPV4 for pebble only. Built by tests/images/build.sh.
ARG BASE
FROM ${BASE}
COPY server.crt server.key pebble-config.json /etc/pebble/
COPY pebble-start /usr/local/bin/
ENV PEBBLE_VA_NOSLEEP=1 PEBBLE_WFE_NONCEREJECT=0 CHALLTESTSRV_IPV4=127.0.0.1 \
    CHALLTESTSRV_PORT=8053
EXPOSE 14000 15000
STOPSIGNAL SIGKILL
CMD ["pebble-start"]
