/**
 * The JSON models that the server extension sends (transient_nb/server/model.py).
 */

export type ClusterStatus =
  'starting' | 'running' | 'unreachable' | 'stale' | 'closed';

/** One VM of a cluster: the PS host or a GPU worker, with its lifecycle state. */
export interface IWorker {
  name: string;
  role: 'ps' | 'worker';
  state: string;
  gpu: string | null;
  zone: string | null;
  spot: boolean | null;
  price: number | null;
  since: number | null;
  seconds_in_state: number | null;
}

export interface ICost {
  cost: number;
  cost_on_demand: number;
  saved: number;
  saved_fraction: number;
  rate_per_hour: number;
  rate_on_demand_per_hour: number;
  /** Each figure above as people read it, written by the server (`eventlog.format.cost_text`):
   * the panel shows these, it formats no money of its own. */
  text: {
    cost: string;
    cost_on_demand: string;
    saved: string;
    saved_fraction: string;
    rate_per_hour: string;
    rate_on_demand_per_hour: string;
  };
}

export interface ITraining {
  run: string | null;
  model: string | null;
  parameters: number | null;
  metrics: { [name: string]: number | null };
  step: number;
  steps: number | null;
  accuracy: number | null;
  loss: number | null;
  img_per_s: number | null;
  active_workers: number | null;
  eta_s: number | null;
  finished: boolean;
  reason: string | null;
  /** The run's line (model, step, metrics, ETA), written by the server
   * (`eventlog.format.training_text`). */
  text: string;
}

export interface ICluster {
  name: string;
  status: ClusterStatus;
  owner: 'panel' | 'kernel' | 'head';
  pid: number | null;
  backend: string | null;
  scheduler_address: string | null;
  dashboard_link: string | null;
  gpu: string | null;
  zone: string | null;
  /** The zones it may use (its own, then its fallbacks): where its PS may move. */
  zones: string[];
  /** Where its PS hosts run now (null while none is up). */
  ps_zone: string | null;
  spot: boolean | null;
  preemption: string | null;
  time_scale: number | null;
  target_workers: number | null;
  /** GPU type -> workers asked for (a mixed cluster has several types). */
  mix: { [gpu: string]: number } | null;
  workers: IWorker[];
  /** Every VM gone so far (the rows keep only the latest): counts, cost and the line that
   * stands for them (written by the server); null while none is gone. */
  gone: {
    preempted: number;
    given_back: number;
    cost: number;
    text: string;
  } | null;
  /** Dollars per GPU type (the PS host as "ps"), and written (`text`) by the server. */
  cost_by_gpu: { [gpu: string]: { vms: number; cost: number; text: string } };
  counts: { [state: string]: number };
  cost: ICost;
  preemptions: number;
  training: ITraining | null;
  last_control: {
    action: string;
    ok: boolean;
    error: string | null;
  } | null;
  /** The transient-aware policy that is on (null: none). */
  policy: IPolicy | null;
  connect_code: string;
}

export interface IPolicy {
  /** The line the notebook panel shows too (`views.format.policy_text`). */
  text: string;
  goal: string;
  deadline_s: number | null;
  budget: number | null;
  /** Its latest decision (null before a training run gives it steps to plan for). */
  decision: {
    time: number;
    reason: string;
    acted: boolean;
    feasible: boolean;
    eta_s: number | null;
    expected_cost: number | null;
    mix: { [gpu: string]: number };
    /** P(losing at least 1, 2, 3 workers within the hour). */
    p_lose_1h: number[];
  } | null;
}

export interface IClusterList {
  clusters: ICluster[];
  version: string;
}

export interface IOptions {
  defaults: {
    workers: number;
    gpu: string;
    zone: string;
    spot: boolean;
    preemption: string;
    time_scale: number;
    notice: string;
    provisioning_delay: string;
  };
  gpus: string[];
  zones: string[];
  catalog: string;
  preemption_examples: string[];
  workers_examples?: string[];
}

/** What the "Scale" form sends. */
export interface IScale {
  /** A number, or a mix of GPU types such as "k80=2,v100=1". */
  workers: number | string;
  /** How many of them run on demand (a number or a mix); left out: as they are. */
  on_demand?: number | string;
}

/** What the "new cluster" form sends. */
export interface INewCluster {
  name?: string;
  /** A number, or a mix of GPU types such as "k80=2,v100=1". */
  workers: number | string;
  /** Left out with a mix, which names its own types. */
  gpu?: string;
  zone: string;
  spot: boolean;
  preemption: string;
}
