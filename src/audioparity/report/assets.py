"""The report page's static parts: the status colours, the stylesheet and the filters' script
(:mod:`.html`'s module docstring says what the filters do), all inline in the page."""

from __future__ import annotations

#: Status -> (background, text colour): green passes, red fails, amber declared failures.
STATUS_COLOURS = {
    "pass": ("#cdebd3", "#14532d"),
    "fail": ("#f5b5b0", "#7f1d1d"),
    "xfail": ("#fbe3a6", "#713f12"),
    "crashed": ("#9f1239", "#ffffff"),
    "missing": ("#d4d4d8", "#27272a"),
    "unavailable": ("#f4f4f5", "#71717a"),
}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#18181b;
margin:24px 32px;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
#e4e4e7;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.sub{color:#52525b;margin:0 0 14px}.note{color:#52525b;font-size:12.5px;margin:4px 0 10px}
.badges{display:flex;gap:10px;flex-wrap:wrap;margin:10px 0}
.badge{border-radius:8px;padding:8px 14px;min-width:84px;text-align:center}
.badge b{display:block;font-size:24px;line-height:1.1}
.badge.zero{background:#fafafa;color:#a1a1aa}
.verdict{font-size:15px;font-weight:600;margin:6px 0}
table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #e4e4e7;padding:3px 7px;text-align:left;vertical-align:top}
thead th{background:#f4f4f5;position:sticky;top:0}
table.matrix td{text-align:center;font-variant-numeric:tabular-nums;min-width:54px;
padding:2px 5px;white-space:nowrap}table.matrix .edge{border-left:2px solid #71717a}
table.matrix th.stage{font-weight:500;font-family:ui-monospace,Menlo,monospace;font-size:12px}
table.matrix tr.group th{background:#fafafa;font-weight:600;text-align:left}
td.empty{background:repeating-linear-gradient(45deg,#fff,#fff 4px,#f4f4f5 4px,#f4f4f5 8px)}
table.full td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.full td.reason{max-width:520px}table.full td.gate{white-space:nowrap;font-size:11.5px}
.legend span{display:inline-block;border-radius:4px;padding:1px 8px;margin-right:6px}
img{max-width:100%;display:block;margin:6px 0 14px}
table.matrix small.cost{color:#52525b;font-size:10.5px}
table.matrix td.unmeasured{outline:2px dashed #a16207;outline-offset:-3px}
small.unmeasured,p.unmeasured b{color:#a16207;font-size:10.5px;font-weight:600}
[hidden]{display:none!important}
table.matrix th.stage,table.matrix th.corner{position:sticky;left:0;background:#fff;z-index:1}
table.matrix th.corner{background:#f4f4f5;z-index:2}
form.filters{background:#fafafa;border:1px solid #e4e4e7;border-radius:8px;padding:6px 10px;
margin:10px 0;font-size:12.5px}form.filters fieldset{border:0;margin:2px 0;padding:0}
form.filters legend{font-weight:600;float:left;min-width:92px}
form.filters label{margin-right:9px;white-space:nowrap;display:inline-block}
form.filters button{font-size:11px;padding:0 5px;margin-right:4px}
.cause{border-left:4px solid #e4e4e7;padding:2px 0 2px 10px;margin:8px 0}
.cause p{margin:0 0 2px}.cause ul{margin:0;padding-left:18px;font-size:12.5px}
.cause .family{color:#52525b}.pill{border-radius:4px;padding:0 6px;font-size:12px}
table.sweep td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.sweep td.front{font-weight:700}table.sweep td.fallbacks{font-size:11.5px}
details.lines summary{cursor:pointer}details.lines div{font-family:ui-monospace,Menlo,
monospace;font-size:11px;white-space:pre;max-height:240px;overflow:auto}
"""


def status_css() -> str:
    return "".join(
        f".st-{s}{{background:{bg};color:{fg}}}" for s, (bg, fg) in STATUS_COLOURS.items()
    )


#: The filters' script (module docstring): reads the fragment and the checkboxes, hides what
#: they leave out, narrows the matrices' spanning headers, hides the matrix rows and causes
#: left with nothing to show, writes the fragment back on a change.
SCRIPT = """
(function () {
  "use strict";
  var body = document.body;
  window.addEventListener("error", function (e) {
    body.setAttribute("data-js-error", String(e.message));
  });
  var DIMS = ["candidate", "backend", "weight_type"];
  var form = document.getElementById("filters");
  function each(list, fn) { Array.prototype.forEach.call(list, fn); }
  function boxes(dim) {
    return Array.prototype.slice.call(form.querySelectorAll('input[name="' + dim + '"]'));
  }
  function chosen() {
    var out = {};
    DIMS.forEach(function (dim) {
      var all = boxes(dim);
      var on = all.filter(function (b) { return b.checked; }).map(function (b) { return b.value; });
      out[dim] = on.length === all.length ? null : on;
    });
    return out;
  }
  function readHash() {
    var hash = location.hash.slice(1);
    if (hash.indexOf("=") < 0) { return false; }
    var wanted = {};
    hash.split("&").forEach(function (part) {
      var eq = part.indexOf("=");
      if (eq > 0) {
        wanted[decodeURIComponent(part.slice(0, eq))] =
          part.slice(eq + 1).split(",").map(decodeURIComponent);
      }
    });
    DIMS.forEach(function (dim) {
      boxes(dim).forEach(function (b) {
        b.checked = !wanted[dim] || wanted[dim].indexOf(b.value) >= 0;
      });
    });
    return true;
  }
  function selection(sel) {
    return DIMS.filter(function (d) { return sel[d]; }).map(function (d) {
      return d + "=" + sel[d].map(encodeURIComponent).join(",");
    }).join("&");
  }
  function writeHash(sel) {
    var text = selection(sel);
    try {
      history.replaceState(null, "", text ? "#" + text : location.pathname + location.search);
    } catch (err) { /* the page filters all the same */ }
  }
  function shows(el, sel) {
    return DIMS.every(function (d) {
      var v = el.getAttribute("data-" + d.replace("_", "-"));
      return v === null || !sel[d] || sel[d].indexOf(v) >= 0;
    });
  }
  function apply() {
    var sel = chosen(), hidden = 0;
    each(document.querySelectorAll("[data-candidate],[data-backend],[data-weight-type]"),
      function (el) { el.hidden = !shows(el, sel); if (el.hidden) { hidden += 1; } });
    each(document.querySelectorAll("table.matrix"), function (table) {
      var leaves = table.querySelectorAll("thead th.leaf"), any = false;
      each(table.querySelectorAll("thead th.span"), function (th) {
        var first = +th.getAttribute("data-first"), n = +th.getAttribute("data-span"), seen = 0;
        for (var i = first; i < first + n; i += 1) { if (!leaves[i].hidden) { seen += 1; } }
        th.hidden = seen === 0;
        if (seen) { th.colSpan = seen; }
      });
      var group = null, groupShown = false;
      each(table.querySelectorAll("tbody tr"), function (tr) {
        if (tr.classList.contains("group")) {
          if (group) { group.hidden = !groupShown; }
          group = tr; groupShown = false;
          return;
        }
        var shown = Array.prototype.some.call(tr.querySelectorAll("td"), function (td) {
          return !td.hidden && !td.classList.contains("empty");
        });
        tr.hidden = !shown;
        groupShown = groupShown || shown;
        any = any || shown;
      });
      if (group) { group.hidden = !groupShown; }
      table.hidden = !any;
    });
    each(document.querySelectorAll(".cause"), function (cause) {
      cause.hidden = !cause.querySelector("li:not([hidden])");
    });
    body.setAttribute("data-hidden", String(hidden));
    body.setAttribute("data-selection", selection(sel));
  }
  form.addEventListener("change", function () { writeHash(chosen()); apply(); });
  each(form.querySelectorAll("button[data-all]"), function (button) {
    button.addEventListener("click", function () {
      boxes(button.getAttribute("data-all")).forEach(function (b) {
        b.checked = button.getAttribute("data-on") === "1";
      });
      writeHash(chosen());
      apply();
    });
  });
  window.addEventListener("hashchange", function () { if (readHash()) { apply(); } });
  readHash();
  apply();
  body.setAttribute("data-filters", "ready");
})();
"""
