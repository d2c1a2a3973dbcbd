/**
 * How the panel writes what it shows: money, rates, shares, durations, a cluster's placement,
 * its training run, and the message of an error.
 */

import { ServerConnection } from '@jupyterlab/services';

import { ICluster, ITraining } from './types';

export function dollars(x: number | null): string {
  const v = x ?? 0;
  return `$${Math.abs(v) < 10 ? v.toFixed(4) : v.toFixed(2)}`;
}

export function rate(x: number | null): string {
  return `$${(x ?? 0).toFixed(3)}/h`;
}

export function percent(x: number | null, digits = 0): string {
  return `${((x ?? 0) * 100).toFixed(digits)}%`;
}

export function duration(seconds: number): string {
  if (seconds < 90) {
    return `${Math.round(seconds)} s`;
  }
  if (seconds < 90 * 60) {
    return `${Math.round(seconds / 60)} min`;
  }
  const h = Math.floor(seconds / 3600);
  return `${h} h ${Math.round((seconds - h * 3600) / 60)} min`;
}

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

/**
 * A training run's line: its model and size, step, every metric of the last evaluation
 * (accuracy as a percentage), and its ETA or how it finished.
 */
export function trainingText(t: ITraining): string {
  // Every metric of the last evaluation (a user's own), accuracy as a percentage.
  const metrics = Object.entries(t.metrics ?? {}).map(([name, value]) =>
    value === null
      ? ''
      : name === 'accuracy'
        ? `accuracy ${percent(value, 1)}`
        : `${name} ${value.toPrecision(4)}`
  );
  const model = t.model
    ? `${t.model}${t.parameters !== null && t.parameters !== undefined ? ` (${t.parameters.toLocaleString()} parameters)` : ''}`
    : '';
  const parts = [
    model,
    `step ${t.step}${t.steps ? `/${t.steps}` : ''}`,
    ...(metrics.length
      ? metrics
      : [t.accuracy !== null ? `accuracy ${percent(t.accuracy, 1)}` : '']),
    t.finished
      ? `finished (${t.reason ?? 'done'})`
      : t.eta_s !== null
        ? `ETA ${duration(t.eta_s)}`
        : ''
  ].filter(Boolean);
  return `Training: ${parts.join(' · ')}`;
}
