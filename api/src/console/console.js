// Progressive enhancement only: every page works without this script.
// Copy buttons copy their secret; forms with data-confirm ask first.
document.addEventListener("click", async (ev) => {
  const button = ev.target.closest("[data-copy]");
  if (!button) return;
  const input = document.getElementById(button.dataset.copy);
  input.select();
  try {
    await navigator.clipboard.writeText(input.value);
  } catch (_) {
    document.execCommand("copy");
  }
  button.textContent = "Copied";
});
document.addEventListener("submit", (ev) => {
  const message = ev.target.dataset.confirm;
  if (message && !window.confirm(message)) ev.preventDefault();
});
