# Sourced by scripts/services.sh and scripts/cluster.sh: installing missing
# Debian packages, which they do only as root on Debian. The sourcing script
# defines log.

can_install() { [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null; }

APT_UPDATED=
apt_install() {
	if [ -z "$APT_UPDATED" ]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		APT_UPDATED=1
	fi
	log "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
