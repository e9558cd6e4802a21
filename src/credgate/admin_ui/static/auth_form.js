// Custom Configure and integration settings: the preview of how the key is sent, kept up to date as the name,
// prefix and key are typed (the page renders it from the saved values; this script only refreshes it). Which
// fields show for the chosen method is panel.css's work, with or without this script. The key's hint is its last
// four characters, as the key table shows them, and only for a key long enough to spare them.
const preview = document.getElementById("auth_preview");
if (preview) {
  const form = preview.closest("form");
  const value = (name) => form.elements.namedItem(name)?.value ?? "";
  const wordPrefix = (prefix) => {
    const trimmed = prefix.trimStart();
    return /[A-Za-z0-9]$/.test(trimmed) ? `${trimmed} ` : trimmed;
  };
  const keyHint = () => {
    const key = value("api_key").trim();
    return key.length >= 12 ? `…${key.slice(-4)}` : preview.dataset.hint || "<key>";
  };
  const show = (method, text) => {
    const code = preview.querySelector(`[data-auth="${method}"] code`);
    if (code) code.textContent = text;
  };
  const refresh = () => {
    const key = keyHint();
    const name = value("auth_name").trim() || "<name>";
    show("bearer", `Authorization: Bearer ${key}`);
    show("header", `${name}: ${wordPrefix(value("auth_prefix"))}${key}`);
    show("query", `?${name}=${key}`);
  };
  form.addEventListener("input", refresh);
  form.addEventListener("change", refresh);
}
