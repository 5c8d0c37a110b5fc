# Debian's nginx (12: 1.22 + njs 0.7.9; 13: 1.26.3 + njs 0.8.9) laid out like the official nginx
# image (conf.d, /etc/nginx/modules, user nginx uid/gid 101, logs to stdout/stderr). Built by
# tests/images/build.sh; never pulls.
ARG BASE
FROM ${BASE}
COPY nginx.conf /etc/nginx/nginx.conf
COPY default.conf /etc/nginx/conf.d/default.conf
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
