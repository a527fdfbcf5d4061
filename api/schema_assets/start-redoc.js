// Starts Redoc on the docs page; a file, not an inline script, so the page's CSP needs none.
(function () {
  var container = document.getElementById("redoc-container");
  Redoc.init(container.getAttribute("data-spec-url"), {}, container);
})();
