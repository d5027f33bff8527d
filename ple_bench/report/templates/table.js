/* ple_bench report tables: sorting, filtering, and a self-check for tests.
   Vanilla JS, inlined into the page; no network, no libraries.

   - Every <table class="data sortable">: click (or Enter on) a header to sort;
     numeric columns (th data-type="num") sort by the cell's data-v value.
     Empty cells stay last in both directions.
   - A <div class="controls" data-for="TABLE_ID"> holds a text filter
     (all space-separated terms must match; "!term" excludes) and optionally
     a status filter (select matching rows' data-status).
   - Click on an img.zoomable: the #lightbox overlay shows it at its full stored size (scroll to
     move around); a click or Esc closes it.
   - When the page has loaded, <body> gets data-ready="1", data-images-total,
     data-images-loaded (images with naturalWidth > 0), data-js-errors, and the layout as the
     browser test reads it: data-viewport-width, data-scroll-width (the document's), data-wide
     (elements that reach past the viewport's right edge outside a scrolling box), and the
     first plot's box (data-first-plot-top / -bottom), and the text seen before scrolling
     (data-first-screen-text).
   - With "#selftest" in the URL, the tables' sorting and filtering are
     exercised and the outcome lands in body[data-selftest]; on load every plot is opened in
     the lightbox and closed, the outcome in body[data-zoomtest]. */
(function () {
  "use strict";

  function cellKey(row, idx, numeric) {
    var cell = row.cells[idx];
    if (!cell) { return null; }
    var raw = cell.hasAttribute("data-v") ? cell.getAttribute("data-v") : cell.textContent.trim();
    if (raw === "" || raw === null) { return null; }
    if (numeric) {
      var f = parseFloat(raw);
      return isNaN(f) ? null : f;
    }
    return raw.toLowerCase();
  }

  function sortTable(table, idx, dir) {
    var head = table.tHead.rows[0].cells;
    var th = head[idx];
    var numeric = th.getAttribute("data-type") === "num";
    if (!dir) { dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending"; }
    for (var i = 0; i < head.length; i++) { head[i].removeAttribute("aria-sort"); }
    th.setAttribute("aria-sort", dir);
    var sign = dir === "ascending" ? 1 : -1;
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows).map(function (row, pos) {
      return { row: row, key: cellKey(row, idx, numeric), pos: pos };
    });
    rows.sort(function (a, b) {
      if (a.key === null && b.key === null) { return a.pos - b.pos; }
      if (a.key === null) { return 1; }
      if (b.key === null) { return -1; }
      if (a.key < b.key) { return -sign; }
      if (a.key > b.key) { return sign; }
      return a.pos - b.pos;
    });
    var frag = document.createDocumentFragment();
    rows.forEach(function (r) { frag.appendChild(r.row); });
    body.appendChild(frag);
  }

  function setupSorting(table) {
    var head = table.tHead && table.tHead.rows[0];
    if (!head) { return; }
    Array.prototype.forEach.call(head.cells, function (th, idx) {
      th.tabIndex = 0;
      th.title = "Sort by " + th.textContent.trim();
      th.addEventListener("click", function () { sortTable(table, idx); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortTable(table, idx); }
      });
    });
  }

  function filterTable(table, text, status) {
    var terms = (text || "").toLowerCase().split(/\s+/).filter(Boolean);
    var rows = table.tBodies[0].rows;
    var shown = 0;
    for (var i = 0; i < rows.length; i++) {
      var row = rows[i];
      if (row._hay === undefined) { row._hay = row.textContent.toLowerCase(); }
      var ok = !status || row.getAttribute("data-status") === status;
      for (var t = 0; ok && t < terms.length; t++) {
        var term = terms[t];
        if (term.charAt(0) === "!" && term.length > 1) {
          ok = row._hay.indexOf(term.slice(1)) === -1;
        } else {
          ok = row._hay.indexOf(term) !== -1;
        }
      }
      row.hidden = !ok;
      if (ok) { shown++; }
    }
    table.setAttribute("data-shown", String(shown));
    return shown;
  }

  function setupFilter(controls) {
    var table = document.getElementById(controls.getAttribute("data-for"));
    if (!table) { return; }
    var input = controls.querySelector("input.filter-text");
    var select = controls.querySelector("select.filter-status");
    var count = controls.querySelector(".count");
    function apply() {
      var shown = filterTable(table, input ? input.value : "", select ? select.value : "");
      if (count) { count.textContent = shown + " of " + table.tBodies[0].rows.length + " rows shown"; }
    }
    if (input) { input.addEventListener("input", apply); }
    if (select) { select.addEventListener("change", apply); }
    controls._apply = apply;
    apply();
  }

  function visibleRows(table) {
    return Array.prototype.filter.call(table.tBodies[0].rows, function (r) { return !r.hidden; });
  }

  // ----------------------------------------------------------------- lightbox
  function openLightbox(img) {
    var box = document.getElementById("lightbox");
    if (!box) { return; }
    var big = document.getElementById("lightbox-img");
    if (!big) {  // made on first use: an image element without a source would count as one that failed
      big = document.createElement("img");
      big.id = "lightbox-img";
      box.appendChild(big);
    }
    big.src = img.src;
    big.alt = img.alt;
    box.hidden = false;
    box.scrollTop = 0;
    box.focus();
  }

  function closeLightbox() {
    var box = document.getElementById("lightbox");
    if (box) { box.hidden = true; }
  }

  function setupLightbox() {
    document.addEventListener("click", function (e) {
      var t = e.target;
      if (t && t.classList && t.classList.contains("zoomable")) { openLightbox(t); return; }
      if (t && t.closest && t.closest("#lightbox")) { closeLightbox(); }
    });
    document.addEventListener("keydown", function (e) { if (e.key === "Escape") { closeLightbox(); } });
  }

  // Every plot opens in the lightbox larger than the page shows it, and closes again
  // (run on load with #selftest: the images must have decoded).
  function zoomTest() {
    var problems = [];
    var imgs = document.querySelectorAll("figure.plot > img.zoomable");
    var box = document.getElementById("lightbox");
    var enlarged = 0;
    Array.prototype.forEach.call(imgs, function (img, i) {
      var inline = img.getBoundingClientRect().width;
      img.click();
      var big = document.getElementById("lightbox-img");
      var shown = box && !box.hidden ? big.getBoundingClientRect().width : 0;
      if (!box || box.hidden) { problems.push("plot " + i + ": click did not open the lightbox"); }
      else if (big.src !== img.src) { problems.push("plot " + i + ": lightbox shows another image"); }
      else if (!(shown > inline * 1.2)) { problems.push("plot " + i + ": enlarged to " + shown + " px from " + inline); }
      else { enlarged++; }
      if (box) { box.click(); }
      if (box && !box.hidden) { problems.push("plot " + i + ": a click did not close the lightbox"); }
    });
    document.body.setAttribute("data-plots-enlarged", String(enlarged));
    document.body.setAttribute("data-plots-zoomable", String(imgs.length));
    document.body.setAttribute("data-zoomtest", problems.length ? "fail: " + problems.join("; ") : "pass");
  }

  function selfTest() {
    var problems = [];
    var tables = document.querySelectorAll("table.data.sortable");
    Array.prototype.forEach.call(tables, function (table) {
      var name = table.id || "table";
      var rows = table.tBodies[0].rows;
      if (!rows.length) { return; }
      // Filtering by status shows exactly the rows with that status.
      var statuses = {};
      Array.prototype.forEach.call(rows, function (r) {
        var s = r.getAttribute("data-status");
        if (s) { statuses[s] = (statuses[s] || 0) + 1; }
      });
      Object.keys(statuses).forEach(function (s) {
        var shown = filterTable(table, "", s);
        if (shown !== statuses[s]) { problems.push(name + ": status " + s + " shows " + shown + " not " + statuses[s]); }
      });
      // A text filter on the first row's first cell shows that row, and only matching rows.
      var probe = rows[0].cells[0].textContent.trim().toLowerCase().split(/\s+/)[0];
      if (probe) {
        var shown = filterTable(table, probe, "");
        var bad = visibleRows(table).filter(function (r) { return r.textContent.toLowerCase().indexOf(probe) === -1; });
        if (shown < 1 || bad.length) { problems.push(name + ": text filter '" + probe + "' shows " + shown + ", wrong " + bad.length); }
      }
      filterTable(table, "", "");
      // Sorting every numeric column gives monotone order both ways, empty cells last.
      var head = table.tHead.rows[0].cells;
      for (var idx = 0; idx < head.length; idx++) {
        if (head[idx].getAttribute("data-type") !== "num") { continue; }
        ["ascending", "descending"].forEach(function (dir) {
          sortTable(table, idx, dir);
          var keys = Array.prototype.map.call(table.tBodies[0].rows, function (r) { return cellKey(r, idx, true); });
          var seenNull = false;
          for (var k = 0; k < keys.length; k++) {
            if (keys[k] === null) { seenNull = true; continue; }
            if (seenNull) { problems.push(name + ": value after empty cell in column " + idx); break; }
            if (k > 0 && keys[k - 1] !== null &&
                (dir === "ascending" ? keys[k] < keys[k - 1] : keys[k] > keys[k - 1])) {
              problems.push(name + ": column " + idx + " not " + dir + " at row " + k);
              break;
            }
          }
        });
      }
      table.setAttribute("data-selftest-rows", String(rows.length));
    });
    Array.prototype.forEach.call(document.querySelectorAll(".controls[data-for]"), function (c) {
      if (c._apply) { c._apply(); }
    });
    document.body.setAttribute("data-selftest", problems.length ? "fail: " + problems.join("; ") : "pass");
  }

  function insideScrollBox(el) {
    for (var p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      var o = window.getComputedStyle(p).overflowX;
      if (o === "auto" || o === "scroll" || o === "hidden") { return true; }
    }
    return false;
  }

  function layout(body) {
    var vw = document.documentElement.clientWidth;
    body.setAttribute("data-viewport-width", String(vw));
    body.setAttribute("data-scroll-width", String(document.documentElement.scrollWidth));
    var wide = [];
    Array.prototype.forEach.call(document.querySelectorAll("body *"), function (el) {
      var r = el.getBoundingClientRect();
      if (r.width > 0 && r.right > vw + 1 && !insideScrollBox(el) && wide.length < 10) {
        wide.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + " (" + Math.round(r.right) + " px)");
      }
    });
    body.setAttribute("data-wide", wide.join("; "));
    // the text a reader sees before scrolling (the browser test checks what it claims)
    var seen = [], walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT, null), node;
    var range = document.createRange(), vh = window.innerHeight;
    while ((node = walker.nextNode())) {
      if (!node.nodeValue.trim()) { continue; }
      range.selectNodeContents(node);
      var rect = range.getBoundingClientRect();
      if (rect.height > 0 && rect.bottom > 0 && rect.top < vh) { seen.push(node.nodeValue.trim()); }
    }
    body.setAttribute("data-first-screen-text", seen.join(" ").slice(0, 8000));
    var first = document.querySelector("figure.plot > img");
    if (first) {
      var box = first.getBoundingClientRect();
      body.setAttribute("data-first-plot-top", String(Math.round(box.top + window.scrollY)));
      body.setAttribute("data-first-plot-bottom", String(Math.round(box.bottom + window.scrollY)));
      body.setAttribute("data-first-plot-width", String(Math.round(box.width)));
    }
  }

  function ready() {
    var imgs = document.images;
    var loaded = 0;
    for (var i = 0; i < imgs.length; i++) {
      if (imgs[i].complete && imgs[i].naturalWidth > 0) { loaded++; }
    }
    var body = document.body;
    body.setAttribute("data-images-total", String(imgs.length));
    body.setAttribute("data-images-loaded", String(loaded));
    var errors = window.__pleErrors || [];
    body.setAttribute("data-js-errors", String(errors.length));
    if (errors.length) { body.setAttribute("data-js-error-text", errors.join(" | ").slice(0, 2000)); }
    var verdict = document.getElementById("verdict");
    if (verdict) {  // where the verdict sits in the first viewport (the browser test reads it)
      var box = verdict.getBoundingClientRect();
      body.setAttribute("data-verdict-top", String(Math.round(box.top + window.scrollY)));
      body.setAttribute("data-verdict-bottom", String(Math.round(box.bottom + window.scrollY)));
    }
    layout(body);
    if (window.location.hash === "#selftest") { zoomTest(); }
    body.setAttribute("data-ready", "1");
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.data.sortable"), setupSorting);
    Array.prototype.forEach.call(document.querySelectorAll(".controls[data-for]"), setupFilter);
    setupLightbox();
    if (window.location.hash === "#selftest") { selfTest(); }
  });
  window.addEventListener("load", ready);
})();
