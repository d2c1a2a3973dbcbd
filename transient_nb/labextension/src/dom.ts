/**
 * The small DOM builders of the panel and its forms: elements, buttons, inputs, selects and
 * labelled fields, with the panel's classes.
 */

export function el(tag: string, className = '', text?: string): HTMLElement {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

export function button(
  label: string,
  className: string,
  onClick: () => unknown,
  disabled = false,
  title = ''
): HTMLButtonElement {
  const node = el('button', className, label) as HTMLButtonElement;
  node.type = 'button';
  node.disabled = disabled;
  node.title = title;
  node.addEventListener('click', () => void onClick());
  return node;
}

export function input(type: string, value: string): HTMLInputElement {
  const node = el(
    'input',
    type === 'checkbox' ? '' : 'jp-mod-styled'
  ) as HTMLInputElement;
  node.type = type;
  node.value = value;
  return node;
}

export function select(choices: string[], value: string): HTMLSelectElement {
  const node = el('select', 'jp-mod-styled') as HTMLSelectElement;
  for (const choice of choices) {
    const option = el('option', '', choice) as HTMLOptionElement;
    option.value = choice;
    node.appendChild(option);
  }
  node.value = value;
  return node;
}

export function field(label: string, control: HTMLElement): HTMLElement {
  const node = el('label', 'tnb-Field');
  node.appendChild(el('span', '', label));
  node.appendChild(control);
  return node;
}
