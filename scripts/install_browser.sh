#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for tests/system/test_jupyterlab.py (issue 11), only where it is missing and we can.
#   bash scripts/install_browser.sh        # called by `make test`; safe to run again (does nothing then)
# Playwright drives this system Chromium (executable_path=/usr/bin/chromium); `playwright install` is never used,
# since it downloads its own browser. Without root or apt-get this prints why and exits 0: the browser test
# then skips with that reason.
set -u
CHROMIUM="${MNIST_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "${MNIST_NO_SYSTEM_INSTALL:-}" = "1" ]; then
    echo "install_browser: MNIST_NO_SYSTEM_INSTALL=1, so Chromium is not installed; the browser test will skip."
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: $CHROMIUM is missing and apt-get is not available; the browser test will skip."
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "install_browser: $CHROMIUM is missing and installing it needs root (sudo apt-get install -y chromium);" \
         "the browser test will skip."
    exit 0
fi
echo "install_browser: installing chromium with apt-get (once)"
if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/tmp/install_browser.log 2>&1; then
    echo "install_browser: apt-get could not install chromium (see /tmp/install_browser.log); the browser test will skip."
    tail -n 5 /tmp/install_browser.log
fi
exit 0
