#!/usr/bin/env bash
# Opens a report.html in a real headless browser (Debian's chromium): the page must render, show
# its verdict, and log no console errors; a screenshot is kept for people to look at.
#
#   scripts/html-smoke.sh [REPORT.html | REPORT_DIR] [SCREENSHOT.png]
#
# With no argument it renders the committed sample (tests/fixtures/report-sample) with
# `ting-chaos report` into a temporary folder first. Without chromium it installs it when running
# as root with apt-get (a clean CI machine), and otherwise prints SKIP and exits 0.
set -euo pipefail
abs() { [[ -z "$1" || "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
target=$(abs "${1:-}")
shot_arg=$(abs "${2:-}")
cd "$(dirname "$0")/.."

if [[ -z "$target" ]]; then
    target=$(mktemp -d)
    cp tests/fixtures/report-sample/report.json tests/fixtures/report-sample/ledger.jsonl "$target/"
    cargo run --quiet -- report "$target" >/dev/null
fi
if [[ -d "$target" ]]; then
    target="$target/report.html"
fi
if [[ ! -s "$target" ]]; then
    echo "html-smoke: $target does not exist (render it with: ting-chaos report DIR)" >&2
    exit 2
fi
html=$(cd "$(dirname "$target")" && pwd)/$(basename "$target")
shot=${shot_arg:-${html%.html}.png}

browser=""
for b in /usr/bin/chromium /usr/bin/chromium-browser; do
    [[ -x "$b" ]] && browser=$b && break
done
if [[ -z "$browser" ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "html-smoke: installing chromium with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
        browser=/usr/bin/chromium
    else
        echo "SKIP html-smoke: no chromium, and cannot install it (not root or no apt-get)"
        exit 0
    fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run
       --disable-dev-shm-usage --hide-scrollbars --enable-logging=stderr --v=0)

"$browser" "${flags[@]}" --user-data-dir="$work/profile-shot" --window-size=1280,2000 \
    --screenshot="$shot" "file://$html" >"$work/shot.out" 2>"$work/shot.log" || {
    cat "$work/shot.log" >&2
    echo "FAIL html-smoke: chromium could not take a screenshot" >&2
    exit 1
}
"$browser" "${flags[@]}" --user-data-dir="$work/profile-dom" --dump-dom "file://$html" \
    >"$work/dom.html" 2>"$work/dom.log" || {
    cat "$work/dom.log" >&2
    echo "FAIL html-smoke: chromium could not load the page" >&2
    exit 1
}

fail=0
if [[ ! -s "$shot" ]]; then
    echo "FAIL html-smoke: no screenshot at $shot" >&2
    fail=1
fi
if ! grep -Eq 'class="big">(PASS|FAIL|ERROR)<' "$work/dom.html"; then
    echo "FAIL html-smoke: the rendered page does not show a verdict" >&2
    fail=1
fi
if grep -E 'Uncaught|ERROR:CONSOLE' "$work/shot.log" "$work/dom.log" >&2; then
    echo "FAIL html-smoke: console errors (above)" >&2
    fail=1
fi
[[ $fail == 0 ]] || exit 1
echo "ok html-smoke: $(grep -Eo 'class="big">[A-Z]+<' "$work/dom.html" | head -1 | tr -d '<>' | sed 's/class="big"//') verdict shown, no console errors, screenshot $shot"
