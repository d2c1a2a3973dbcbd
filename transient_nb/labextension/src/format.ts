/**
 * How the panel writes what the server does not: a cluster's placement and the message of an
 * error. Money, rates, shares, durations and the training line come written from the server
 * (transient_nb/eventlog/format.py, the one place every surface takes them from): the panel
 * shows those strings as they are.
 */

import { ServerConnection } from '@jupyterlab/services';

import { ICluster } from './types';

export function messageOf(error: unknown): string {
  if (error instanceof ServerConnection.ResponseError) {
    return error.message;
  }
  return error instanceof Error ? error.message : String(error);
}

/**
 * Where a cluster runs, and who owns it: its GPU types (a mix: each count), zone, pricing,
 * target size and owning process, joined with middle dots.
 */
export function placementText(c: ICluster): string {
  const mixed = c.mix ? Object.entries(c.mix).filter(([, n]) => n > 0) : [];
  const placement = [
    mixed.length > 1
      ? mixed.map(([g, n]) => `${n} ${g}`).join(' + ')
      : (c.gpu ?? 'no GPU'),
    c.zone ?? '',
    c.spot === null ? '' : c.spot ? 'spot' : 'on-demand',
    c.target_workers !== null
      ? `target ${c.target_workers} worker${c.target_workers === 1 ? '' : 's'}`
      : '',
    c.owner === 'head'
      ? `head pid ${c.pid}`
      : c.owner === 'panel'
        ? 'started here'
        : c.pid
          ? `kernel pid ${c.pid}`
          : ''
  ].filter(Boolean);
  return placement.join(' · ');
}
