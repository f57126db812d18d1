#!/usr/bin/env bash
# Installs what the test suites need on a fresh Debian machine. Packages come
# from apt when running as root; otherwise a missing package is an error that
# says what to install.
set -euo pipefail

need=()
command -v squid >/dev/null 2>&1 || [ -x /usr/sbin/squid ] || need+=(squid)
# Headless Chromium loads pages through the gateway in the e2e tests.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Real clients load pages through the MITM gateway in the e2e tests.
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v node >/dev/null 2>&1 || need+=(nodejs)
if ! { python3 -c 'import requests' || /usr/bin/python3 -c 'import requests'; } >/dev/null 2>&1; then need+=(python3-requests); fi
# The Redis lease store's tests start their own redis-server on free ports.
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need+=(redis-server)

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ]; then
		echo "install-deps: apt-get install ${need[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq "${need[@]}" >/dev/null
		# The package starts a system squid on :3128; the tests run their own.
		if command -v systemctl >/dev/null 2>&1; then systemctl disable --now squid >/dev/null 2>&1 || true; fi
		service squid stop >/dev/null 2>&1 || true
		# Likewise a system redis on :6379; tests never use it.
		if command -v systemctl >/dev/null 2>&1; then systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
		service redis-server stop >/dev/null 2>&1 || true
	else
		echo "install-deps: missing ${need[*]}; run 'sudo apt-get install -y ${need[*]}' or run make test as root" >&2
		exit 1
	fi
fi
