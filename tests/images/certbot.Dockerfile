# Debian's certbot 2.1 standing in for certbot/certbot: it trusts the test ACME server's HTTPS
# certificate (acme-ca.crt, made by build.sh) besides Debian's CAs. Built by tests/images/build.sh.
ARG BASE
FROM ${BASE}
COPY acme-ca.crt /usr/local/share/ca-certificates/kit-test-acme.crt
RUN update-ca-certificates >/dev/null
ENTRYPOINT ["certbot"]
