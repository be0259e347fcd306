#!/usr/bin/env bash
# Opens a report.html in a real headless browser (Debian's chromium): the page must render, show
# its verdict, and raise no errors (console.error, uncaught exceptions, resources that fail to
# load); a screenshot is kept for people to look at.
#
#   scripts/html-smoke.sh [REPORT.html | REPORT_DIR] [SCREENSHOT.png]
#   scripts/html-smoke.sh --self-test
#
# With no report it renders the committed sample (tests/fixtures/report-sample) with
# `ting-chaos report` into a temporary folder first. The screenshot goes to SCREENSHOT.png, by
# default reports/ci/html-smoke.png (git-ignored; where CI keeps it).
#
# How errors are seen: report.html has no scripts, so the page cannot count its own errors.
# Chromium's log is no help either: it logs every console message of a web page at INFO
# (`INFO:CONSOLE`), console.error included, and a failed image load the same way. So the check
# loads a probe: a copy of the page beside it (same folder, so every relative URL resolves the
# same) with one inline script put first in <head>. The script counts console.error calls,
# uncaught exceptions, unhandled rejections and resources that fail to load (a capturing `error`
# listener), and on `load` writes the count on <html data-smoke-errors="N">; `--dump-dom` then
# shows it. No attribute means the probe did not run: that fails too. The report itself is
# never changed.
#
# `--self-test` runs the check on tests/fixtures/html-smoke/: the clean page must pass, and pages
# with a console.error, an uncaught exception, a broken image or no verdict must each fail.
#
# Without chromium it installs it when running as root with apt-get (a clean CI machine);
# otherwise it fails under CI (CI set) and prints SKIP and exits 0 elsewhere.
set -euo pipefail
abs() { [[ -z "$1" || "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
here=$(cd "$(dirname "$0")/.." && pwd)

if [[ "${1:-}" == "--self-test" ]]; then
    fixtures="$here/tests/fixtures/html-smoke"
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    bad=0
    for page in clean console-error uncaught broken-image no-verdict; do
        want=fail
        [[ $page == clean ]] && want=pass
        if "$0" "$fixtures/$page.html" "$out/$page.png" >"$out/$page.log" 2>&1; then got=pass; else got=fail; fi
        if grep -q '^SKIP html-smoke' "$out/$page.log"; then
            # No browser here (and not CI): nothing was checked, so nothing to judge.
            cat "$out/$page.log"
            exit 0
        fi
        if [[ $got != "$want" ]]; then
            sed 's/^/    /' "$out/$page.log" >&2
            echo "FAIL html-smoke self-test: $page.html should $want, did $got" >&2
            bad=1
        fi
    done
    [[ $bad == 0 ]] || exit 1
    echo "ok html-smoke self-test: the clean page passes; console.error, an uncaught exception, a broken image and a missing verdict each fail"
    exit 0
fi

target=$(abs "${1:-}")
shot_arg=$(abs "${2:-}")
cd "$here"

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
shot=${shot_arg:-$here/reports/ci/html-smoke.png}
mkdir -p "$(dirname "$shot")"

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
    elif [[ -n "${CI:-}" ]]; then
        echo "FAIL html-smoke: no chromium, and cannot install it (not root or no apt-get)" >&2
        exit 1
    else
        echo "SKIP html-smoke: no chromium, and cannot install it (not root or no apt-get)"
        exit 0
    fi
fi

work=$(mktemp -d)
probe="$(dirname "$html")/.html-smoke-probe-$$.html"
trap 'rm -rf "$work" "$probe"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run
       --disable-dev-shm-usage --hide-scrollbars --enable-logging=stderr --v=0
       --virtual-time-budget=5000)

# The probe script (see the header). Inserted right after <head>, or first in the file.
read -r -d '' counter <<'JS' || true
<script>(function(){var n=0,m=[];function note(s){n++;m.push(String(s).slice(0,300));}
var ce=console.error;console.error=function(){note("console.error: "+Array.prototype.map.call(arguments,String).join(" "));return ce.apply(console,arguments);};
window.addEventListener("error",function(e){var t=e.target;if(t&&t!==window&&t.nodeType===1){note("failed to load <"+t.tagName.toLowerCase()+"> "+(t.currentSrc||t.src||t.href||""));}else{note("uncaught: "+e.message);}},true);
window.addEventListener("unhandledrejection",function(e){note("unhandled rejection: "+e.reason);});
window.addEventListener("load",function(){var h=document.documentElement;h.setAttribute("data-smoke-errors",String(n));h.setAttribute("data-smoke-messages",m.join(" | "));});})();</script>
JS
if grep -Eqi '<head([[:space:]][^>]*)?>' "$html"; then
    COUNTER="$counter" awk '!done && match(tolower($0), /<head([ \t][^>]*)?>/) {
        $0 = substr($0, 1, RSTART + RLENGTH - 1) ENVIRON["COUNTER"] substr($0, RSTART + RLENGTH); done = 1
    } { print }' "$html" >"$probe"
else
    { printf '%s\n' "$counter"; cat "$html"; } >"$probe"
fi

"$browser" "${flags[@]}" --user-data-dir="$work/profile-shot" --window-size=1280,2000 \
    --screenshot="$shot" "file://$html" >"$work/shot.out" 2>"$work/shot.log" || {
    cat "$work/shot.log" >&2
    echo "FAIL html-smoke: chromium could not take a screenshot" >&2
    exit 1
}
"$browser" "${flags[@]}" --user-data-dir="$work/profile-dom" --dump-dom "file://$probe" \
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
errors=$(grep -Eo 'data-smoke-errors="[0-9]+"' "$work/dom.html" | head -1 | grep -Eo '[0-9]+' || true)
if [[ -z "$errors" ]]; then
    echo "FAIL html-smoke: the error probe did not report (the page never finished loading?)" >&2
    fail=1
elif [[ "$errors" != 0 ]]; then
    messages=$(grep -Eo 'data-smoke-messages="[^"]*"' "$work/dom.html" | head -1 | sed 's/^data-smoke-messages="//; s/"$//')
    echo "FAIL html-smoke: $errors error(s) in the page: $messages" >&2
    fail=1
fi
# Belt and braces: what chromium logged for the page itself (the probe's copy included).
if grep -E 'Uncaught|Failed to load resource' "$work/shot.log" "$work/dom.log" >&2; then
    echo "FAIL html-smoke: errors in chromium's log (above)" >&2
    fail=1
fi
[[ $fail == 0 ]] || exit 1
echo "ok html-smoke: $(grep -Eo 'class="big">[A-Z]+<' "$work/dom.html" | head -1 | tr -d '<>' | sed 's/class="big"//') verdict shown, no errors, screenshot $shot"
