// Copy buttons: the only script of the panel (served by credgate itself; the CSP forbids inline script).
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  try {
    await navigator.clipboard.writeText(source.textContent.trim());
    button.textContent = "Copied";
  } catch {
    window.getSelection().selectAllChildren(source);
    button.textContent = "Press Ctrl+C";
  }
});
