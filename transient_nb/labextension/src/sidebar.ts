import {
  Dialog,
  InputDialog,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { button, el } from './dom';
import { messageOf, placementText } from './format';
import { NewClusterForm, ScaleForm } from './forms';
import { requestAPI } from './handler';
import { ICluster, IClusterList, IOptions, IWorker } from './types';

// The forms were defined here first: their names still come from this module too.
export { NewClusterForm, ScaleForm, workersValue } from './forms';

/**
 * How long the server may hold a list request open when nothing changes (seconds). The server
 * answers as soon as something a user would see changes, so news arrive within half a second
 * while an idle panel makes one request per LONG_POLL_S.
 */
const LONG_POLL_S = 10;

/**
 * Gap between two list requests, and the backoff when the server is unreachable (ms).
 */
const POLL_INTERVAL_MS = 500;
const POLL_MAX_MS = 30 * 1000;

/**
 * The "Transient clusters" side panel: every transient cluster of this user, live.
 */
export class TransientSidebar extends Widget {
  constructor(options: TransientSidebar.IOptions) {
    super();
    this.id = 'transient-nb-sidebar';
    this.addClass('tnb-Sidebar');
    this.title.caption = 'Transient clusters';
    this._insertConnect = options.insertConnect;

    const header = el('header', 'tnb-Header');
    header.appendChild(el('h2', 'tnb-Title', 'Transient clusters'));
    header.appendChild(
      button('New cluster', 'tnb-NewButton jp-mod-styled jp-mod-accept', () =>
        this.newCluster()
      )
    );
    this._message = el('div', 'tnb-Message');
    this._list = el('div', 'tnb-ClusterList');
    this.node.append(header, this._message, this._list);

    this._poll = new Poll({
      factory: () => this._refresh(),
      frequency: {
        interval: POLL_INTERVAL_MS,
        backoff: true,
        max: POLL_MAX_MS
      },
      name: 'transient-nb:clusters',
      // Stand by while the panel is collapsed, and while the browser tab is hidden.
      standby: () => (this.isVisible ? 'when-hidden' : true)
    });
  }

  /**
   * The clusters shown now.
   */
  get clusters(): ReadonlyArray<ICluster> {
    return this._clusters;
  }

  /**
   * Fetch the list now, without waiting for a change.
   */
  refresh(): Promise<void> {
    this._now = true;
    return this._poll.refresh();
  }

  /**
   * Ask for a new cluster with a short form, and start it in the Jupyter server.
   */
  async newCluster(): Promise<void> {
    let options: IOptions;
    try {
      options = this._options ?? (await requestAPI<IOptions>('options'));
      this._options = options;
    } catch (error) {
      return void showErrorMessage(
        'Cannot reach the transient_nb server extension',
        error as Error
      );
    }
    const result = await showDialog({
      title: 'New transient cluster',
      body: new NewClusterForm(options),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Start' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || !result.value) {
      return;
    }
    await this._act('Starting the cluster failed', () =>
      requestAPI<ICluster>('clusters', {
        method: 'POST',
        body: JSON.stringify(result.value)
      })
    );
  }

  protected onAfterShow(): void {
    void this.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._abort?.abort();
    this._poll.dispose();
    super.dispose();
  }

  private async _refresh(): Promise<void> {
    const seq = ++this._seq;
    // A newer request supersedes a pending long poll.
    this._abort?.abort();
    const abort = (this._abort = new AbortController());
    const wait = this._version && !this._now ? LONG_POLL_S : 0;
    this._now = false;
    const query = this._version
      ? `?version=${encodeURIComponent(this._version)}&wait=${wait}`
      : '';
    try {
      const data = await requestAPI<IClusterList>(`clusters${query}`, {
        signal: abort.signal
      });
      if (seq !== this._seq) {
        return;
      }
      this._version = data.version;
      this._clusters = data.clusters;
      this._showMessage('');
      this._render();
    } catch (error) {
      if (abort.signal.aborted) {
        return;
      }
      this._version = '';
      this._showMessage(
        `Cannot reach the transient_nb server extension (${messageOf(error)}); retrying.`
      );
      throw error; // the poll backs off
    }
  }

  /**
   * Run a panel action, report its error, and refresh the list at once.
   */
  private async _act(
    what: string,
    action: () => Promise<unknown>
  ): Promise<void> {
    this.addClass('tnb-mod-busy');
    try {
      await action();
    } catch (error) {
      void showErrorMessage(what, messageOf(error));
    } finally {
      this.removeClass('tnb-mod-busy');
      void this.refresh();
    }
  }

  private _showMessage(text: string): void {
    this._message.textContent = text;
    this._message.hidden = text.length === 0;
  }

  private _render(): void {
    const list = this._list;
    list.replaceChildren();
    if (this._clusters.length === 0) {
      const empty = el('div', 'tnb-Empty');
      empty.appendChild(el('p', '', 'No transient cluster is running.'));
      empty.appendChild(
        el(
          'p',
          'tnb-Hint',
          'Start one here, or in a notebook with %transient_cluster up or TransientCluster().'
        )
      );
      empty.appendChild(
        button('Create a cluster', 'jp-mod-styled jp-mod-accept', () =>
          this.newCluster()
        )
      );
      list.appendChild(empty);
      return;
    }
    for (const cluster of this._clusters) {
      list.appendChild(this._renderCluster(cluster));
    }
  }

  private _renderCluster(c: ICluster): HTMLElement {
    const card = el('section', `tnb-Cluster tnb-mod-${c.status}`);
    card.dataset.cluster = c.name;
    card.dataset.status = c.status;

    const head = el('div', 'tnb-ClusterHead');
    head.appendChild(el('span', 'tnb-ClusterName', c.name));
    head.appendChild(el('span', `tnb-Badge tnb-mod-${c.status}`, c.status));
    head.appendChild(el('span', 'tnb-Backend', c.backend ?? ''));
    if (c.dashboard_link && c.status === 'running') {
      const link = el('a', 'tnb-Dashboard', 'Dashboard') as HTMLAnchorElement;
      link.href = c.dashboard_link;
      link.target = '_blank';
      link.rel = 'noopener noreferrer';
      link.title = 'Open the Dask dashboard of this cluster';
      head.appendChild(link);
    }
    card.appendChild(head);

    card.appendChild(el('div', 'tnb-Placement', placementText(c)));

    const money = el('div', 'tnb-Cost');
    money.appendChild(el('span', 'tnb-Spent', `${c.cost.text.cost} so far`));
    money.appendChild(
      el('span', 'tnb-Rate', `${c.cost.text.rate_per_hour} now`)
    );
    money.appendChild(
      el(
        'span',
        'tnb-Saved',
        `saved ${c.cost.text.saved} (${c.cost.text.saved_fraction}) vs on-demand`
      )
    );
    card.appendChild(money);
    const types = Object.entries(c.cost_by_gpu ?? {});
    if (types.length > 2) {
      // More than one GPU type beside the PS host: what each type cost.
      card.appendChild(
        el(
          'div',
          'tnb-CostByGpu',
          'Per type: ' +
            types
              .map(
                ([g, r]) =>
                  `${g} ${r.vms} VM${r.vms === 1 ? '' : 's'} ${r.text}`
              )
              .join(', ')
        )
      );
    }

    const counts = Object.entries(c.counts)
      .map(([state, n]) => `${n} ${state}`)
      .join(', ');
    card.appendChild(
      el(
        'div',
        'tnb-Counts',
        `Workers: ${counts || 'none'} · preemptions survived: ${c.preemptions}`
      )
    );

    if (c.training) {
      card.appendChild(el('div', 'tnb-Training', c.training.text));
    }

    if (c.policy) {
      card.appendChild(el('div', 'tnb-Policy', c.policy.text));
    }

    if (c.last_control && !c.last_control.ok) {
      card.appendChild(
        el(
          'div',
          'tnb-Error',
          `${c.last_control.action} failed: ${c.last_control.error}`
        )
      );
    }

    if (c.workers.length > 0) {
      card.appendChild(this._renderWorkers(c));
    }

    const actions = el('div', 'tnb-Actions');
    const live = c.status === 'running';
    actions.appendChild(
      button(
        'Scale…',
        'tnb-ScaleButton jp-mod-styled',
        () => this._scale(c),
        !live
      )
    );
    actions.appendChild(
      button(
        'PS hosts…',
        'tnb-PsButton jp-mod-styled',
        () => this._scalePs(c),
        !live,
        'Add parameter-server hosts, one PS shard each, where fast GPUs saturate one PS'
      )
    );
    const zones = c.zones ?? [];
    actions.appendChild(
      button(
        'Move PS…',
        'tnb-MovePsButton jp-mod-styled',
        () => this._movePs(c),
        !live || zones.length < 2,
        zones.length < 2
          ? 'The cluster may use one zone only: start it with fallback zones to move its PS'
          : 'Move the parameter-server hosts to the zone that holds most workers'
      )
    );
    actions.appendChild(
      button(
        'Adapt…',
        'tnb-AdaptButton jp-mod-styled',
        () => this._adapt(c),
        !live,
        'Let a transient-aware policy choose the GPU mix for a deadline, a budget or cost per step'
      )
    );
    actions.appendChild(
      button(
        'Connect code',
        'tnb-ConnectButton jp-mod-styled',
        () => this._insertConnect(c),
        !live,
        'Insert the code that connects to this cluster into the active notebook'
      )
    );
    actions.appendChild(
      button(
        c.status === 'stale' ? 'Remove' : 'Stop',
        'tnb-StopButton jp-mod-styled jp-mod-warn',
        () => this._stop(c)
      )
    );
    card.appendChild(actions);
    return card;
  }

  /**
   * The live VMs, one row each; the gone ones (revoked, given back) folded into one line that
   * opens on a click ("17 preempted, $0.063": an overnight run would list hundreds). The panel
   * is re-rendered on every change: which clusters' lines are open is kept here.
   */
  private _renderWorkers(c: ICluster): HTMLElement {
    const list = el('div', 'tnb-Workers');
    const gone: IWorker[] = [];
    for (const w of c.workers) {
      if (isGone(w)) {
        gone.push(w);
      } else {
        list.appendChild(this._renderWorker(c, w));
      }
    }
    if (gone.length > 0 || c.gone) {
      const fold = el('details', 'tnb-Gone') as HTMLDetailsElement;
      fold.open = this._goneOpen.has(c.name);
      fold.addEventListener('toggle', () => {
        if (fold.open) {
          this._goneOpen.add(c.name);
        } else {
          this._goneOpen.delete(c.name);
        }
      });
      fold.appendChild(
        el('summary', 'tnb-GoneLine', c.gone?.text ?? `${gone.length} gone`)
      );
      for (const w of gone) {
        fold.appendChild(this._renderWorker(c, w));
      }
      list.appendChild(fold);
    }
    return list;
  }

  private _renderWorker(c: ICluster, w: IWorker): HTMLElement {
    const gone = isGone(w);
    const row = el(
      'div',
      `tnb-Worker tnb-mod-${w.state}${gone ? ' tnb-mod-gone' : ''}`
    );
    row.dataset.worker = w.name;
    row.dataset.state = w.state;
    row.appendChild(el('span', 'tnb-WorkerName', w.name));
    row.appendChild(el('span', 'tnb-WorkerState', w.state));
    const cell = el('span', 'tnb-WorkerAction');
    if (
      w.role === 'worker' &&
      !gone &&
      w.state !== 'notice' &&
      c.status === 'running'
    ) {
      cell.appendChild(
        button(
          'Preempt',
          'tnb-PreemptButton jp-mod-styled',
          () =>
            this._act(`Preempting ${w.name} failed`, () =>
              requestAPI(`clusters/${encodeURIComponent(c.name)}/preempt`, {
                method: 'POST',
                body: JSON.stringify({ worker: w.name, notice: true })
              })
            ),
          false,
          'Preempt this worker as the provider would (with the notice); it is replaced'
        )
      );
    }
    row.appendChild(cell);
    // What it is on a line of its own: the sidebar is too narrow for a column each.
    const info = [
      w.role === 'ps' ? 'parameter server' : (w.gpu ?? 'no GPU'),
      w.spot === null ? '' : w.spot ? 'spot' : 'on-demand',
      w.zone ?? ''
    ].filter(Boolean);
    row.appendChild(el('span', 'tnb-WorkerInfo', info.join(' · ')));
    return row;
  }

  private async _scale(c: ICluster): Promise<void> {
    const result = await showDialog({
      title: `Scale ${c.name}`,
      body: new ScaleForm(c),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Scale' })],
      focusNodeSelector: 'input'
    });
    if (!result.button.accept || !result.value) {
      return;
    }
    const value = result.value;
    await this._act(`Scaling ${c.name} failed`, () =>
      requestAPI(`clusters/${encodeURIComponent(c.name)}/scale`, {
        method: 'POST',
        body: JSON.stringify(value)
      })
    );
  }

  private async _movePs(c: ICluster): Promise<void> {
    const here = c.ps_zone ?? c.zone;
    const others = c.zones.filter(z => z !== here);
    const result = await InputDialog.getItem({
      title: `Move the PS of ${c.name}`,
      label:
        `The PS runs in ${here ?? 'no zone yet'}. New PS hosts start in the zone chosen; a ` +
        'run moves onto them from its PS state, and the old hosts go',
      items: others.length ? others : c.zones,
      current: 0
    });
    if (!result.button.accept || !result.value) {
      return;
    }
    const zone = result.value;
    await this._act(`Moving the PS of ${c.name} failed`, () =>
      requestAPI(`clusters/${encodeURIComponent(c.name)}/move-ps`, {
        method: 'POST',
        body: JSON.stringify({ zone, reason: 'asked from the panel' })
      })
    );
  }

  private async _scalePs(c: ICluster): Promise<void> {
    const hosts = c.workers.filter(
      w => w.role === 'ps' && w.state !== 'preempted' && w.state !== 'deleted'
    ).length;
    const result = await InputDialog.getText({
      title: `PS hosts of ${c.name}`,
      label:
        'PS hosts to keep, 1 to 4 (a running PS only grows): a run started without ' +
        'shards= splits its PS into one shard per host',
      text: String(Math.min(4, Math.max(1, hosts) + 1))
    });
    if (!result.button.accept || result.value === null) {
      return;
    }
    const text = result.value.trim();
    // A whole number goes as one; anything else as typed, for the server to name it.
    const value = /^\d+$/.test(text) ? Number(text) : text;
    await this._act(`Adding PS hosts to ${c.name} failed`, () =>
      requestAPI(`clusters/${encodeURIComponent(c.name)}/scale-ps`, {
        method: 'POST',
        body: JSON.stringify({ hosts: value })
      })
    );
  }

  private async _adapt(c: ICluster): Promise<void> {
    const p = c.policy;
    const now = !p
      ? 'deadline:2h'
      : p.goal === 'deadline' && p.deadline_s
        ? `deadline:${p.deadline_s}s`
        : p.goal === 'budget' && p.budget
          ? `budget:${p.budget}`
          : p.goal;
    const result = await InputDialog.getText({
      title: `Adapt ${c.name}`,
      label:
        'Goal: deadline:2h (cheapest mix that finishes in time), budget:20 (fastest within ' +
        'the dollars), cost-per-step, or off',
      text: now
    });
    if (!result.button.accept || result.value === null) {
      return;
    }
    await this._act(`Adapting ${c.name} failed`, () =>
      requestAPI(`clusters/${encodeURIComponent(c.name)}/adapt`, {
        method: 'POST',
        body: JSON.stringify({ goal: result.value })
      })
    );
  }

  private async _stop(c: ICluster): Promise<void> {
    const stale = c.status === 'stale';
    const result = await showDialog({
      title: stale ? `Remove ${c.name}?` : `Stop ${c.name}?`,
      body: stale
        ? 'Its kernel is gone; this removes it from the list.'
        : 'Its workers are deleted and billing stops; a training run on it ends.',
      buttons: [
        Dialog.cancelButton(),
        Dialog.warnButton({ label: stale ? 'Remove' : 'Stop' })
      ]
    });
    if (!result.button.accept) {
      return;
    }
    await this._act(`Stopping ${c.name} failed`, () =>
      requestAPI(`clusters/${encodeURIComponent(c.name)}`, { method: 'DELETE' })
    );
  }

  private _clusters: ICluster[] = [];
  /** Clusters whose folded line of gone VMs is open (kept across re-renders). */
  private _goneOpen = new Set<string>();
  private _version = '';
  private _now = true;
  private _seq = 0;
  private _abort: AbortController | null = null;
  private _options: IOptions | null = null;
  private _poll: Poll;
  private _list: HTMLElement;
  private _message: HTMLElement;
  private _insertConnect: (cluster: ICluster) => void;
}

export namespace TransientSidebar {
  export interface IOptions {
    /**
     * Put the code that connects to `cluster` into the active notebook.
     */
    insertConnect: (cluster: ICluster) => void;
  }
}

/** A VM revoked or given back (its row stays, greyed, in the folded line). */
function isGone(w: IWorker): boolean {
  return w.state === 'preempted' || w.state === 'deleted';
}
