# Sourced by build.sh and prometheus.sh: debian_mirror prints the Debian mirror apt already uses
# on this host (deb822 sources first, then sources.list), so the test images come from it too.
debian_mirror() {
    local uri
    uri="$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri="$(awk '$1 == "deb" && $2 !~ /^\[/ { print $2; exit }' /etc/apt/sources.list)"
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}
