#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver for the browser tests, if they are missing.
# Without root or apt the browser tests skip themselves with a message saying so.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium and chromium-driver for the browser tests..."
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 \
        || echo "warning: could not install chromium; browser tests will be skipped" >&2
else
    echo "warning: chromium/chromedriver missing and cannot apt-get install them; browser tests will be skipped" >&2
fi
exit 0
