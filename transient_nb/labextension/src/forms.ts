/**
 * The panel's forms: the "new cluster" dialog and the "Scale" dialog, each a dialog body whose
 * value is what the server's route takes.
 */

import { Dialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { el, field, input, select } from './dom';
import { ICluster, INewCluster, IOptions, IScale } from './types';

/**
 * What a workers field holds, as the server takes it: a number, or the text of a mix.
 */
export function workersValue(text: string): number | string {
  const t = text.trim();
  return /^\d+$/.test(t) ? Number(t) : t;
}

/**
 * The body of the "new cluster" dialog: workers, GPU, zone, spot and the preemption spec.
 */
export class NewClusterForm
  extends Widget
  implements Dialog.IBodyWidget<INewCluster>
{
  constructor(options: IOptions) {
    super();
    this.addClass('tnb-NewClusterForm');
    const d = options.defaults;
    this._name = input('text', '');
    this._name.placeholder = 'a fresh name';
    // A number, or a mix of GPU types (k80=2,v100=1): the server checks either.
    this._workers = input('text', String(d.workers));
    this._workers.placeholder = '4, or k80=2,v100=1';
    this._gpu = select(options.gpus, d.gpu);
    this._zone = select(options.zones, d.zone);
    this._spot = input('checkbox', '');
    this._spot.checked = d.spot;
    this._preemption = input('text', d.preemption);
    const examples = el('datalist') as HTMLDataListElement;
    examples.id = 'tnb-preemption-examples';
    for (const spec of options.preemption_examples) {
      const option = el('option') as HTMLOptionElement;
      option.value = spec;
      examples.appendChild(option);
    }
    this._preemption.setAttribute('list', examples.id);
    this.node.append(
      field('Name', this._name),
      field('Workers', this._workers),
      field('GPU', this._gpu),
      field('Zone', this._zone),
      field('Spot (preemptible)', this._spot),
      field('Preemptions', this._preemption),
      examples,
      el(
        'p',
        'tnb-Hint',
        `Prices: ${options.catalog}. Workers: a number, or a mix such as k80=2,v100=1 ` +
          '(the GPU field is then not used). Preemptions: none, paper, paper:k80, ' +
          'exp:mean=60s…'
      )
    );
  }

  getValue(): INewCluster {
    const value: INewCluster = {
      workers: workersValue(this._workers.value),
      zone: this._zone.value,
      spot: this._spot.checked,
      preemption: this._preemption.value.trim()
    };
    if (typeof value.workers === 'number') {
      value.gpu = this._gpu.value; // a mix names its own types
    }
    const name = this._name.value.trim();
    if (name) {
      value.name = name;
    }
    return value;
  }

  private _name: HTMLInputElement;
  private _workers: HTMLInputElement;
  private _gpu: HTMLSelectElement;
  private _zone: HTMLSelectElement;
  private _spot: HTMLInputElement;
  private _preemption: HTMLInputElement;
}

/**
 * The "Scale" form: the GPU workers to keep, and how many of them run on demand.
 */
export class ScaleForm extends Widget implements Dialog.IBodyWidget<IScale> {
  constructor(c: ICluster) {
    super();
    this.addClass('tnb-ScaleForm');
    const mixed = c.mix ? Object.entries(c.mix).filter(([, n]) => n > 0) : [];
    this._workers = input(
      'text',
      mixed.length > 1
        ? mixed.map(([g, n]) => `${g}=${n}`).join(',')
        : String(c.target_workers ?? 1)
    );
    this._workers.placeholder = '4, or k80=2,v100=1';
    this._workers.name = 'workers';
    this._onDemand = input('text', '');
    this._onDemand.name = 'on_demand';
    this._onDemand.placeholder = 'as now';
    const now = c.workers.filter(
      w =>
        w.role === 'worker' &&
        w.spot === false &&
        w.state !== 'preempted' &&
        w.state !== 'deleted'
    ).length;
    this.node.append(
      field('Workers', this._workers),
      field('Of them on demand', this._onDemand),
      el(
        'p',
        'tnb-Hint',
        'Workers: a number, or a mix such as k80=2,v100=1 (the PS host comes on top). On ' +
          'demand: how many of them are never revoked, a number or a mix such as p100=1; 0 ' +
          `for none, empty to keep them as they are (${now} now).`
      )
    );
  }

  getValue(): IScale {
    const value: IScale = { workers: workersValue(this._workers.value) };
    const text = this._onDemand.value.trim();
    if (text) {
      // A whole number goes as one; anything else as typed, for the server to name it.
      value.on_demand = workersValue(text);
    }
    return value;
  }

  private _workers: HTMLInputElement;
  private _onDemand: HTMLInputElement;
}
