import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Clipboard, ICommandPalette, Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

import { TransientSidebar } from './sidebar';
import { ICluster } from './types';

namespace CommandIDs {
  export const newCluster = 'transient-nb:new-cluster';
  export const insertConnect = 'transient-nb:insert-connect';
  export const refresh = 'transient-nb:refresh';
  export const open = 'transient-nb:open';
}

/**
 * The side panel's icon: a cloud with a lightning bolt (preemptible capacity).
 */
const clusterIcon = new LabIcon({
  name: 'transient-nb:cluster',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<path class="jp-icon3" fill="#616161" d="M19 10.1A6 6 0 0 0 7.3 8.4 4.8 4.8 0 0 0 7.5 18H11l1.4-3H10l4-7-1 5h3l-3.4 5H18.5a4 4 0 0 0 .5-7.9z"/>' +
    '</svg>'
});

/**
 * Put `code` into the active notebook: into the active cell when it is an empty code cell,
 * otherwise into a new cell below it.
 */
function insertIntoNotebook(
  tracker: INotebookTracker | null,
  code: string
): boolean {
  const panel = tracker?.currentWidget;
  if (!panel) {
    return false;
  }
  const notebook = panel.content;
  const active = notebook.activeCell;
  if (
    !active ||
    active.model.type !== 'code' ||
    active.model.sharedModel.getSource().trim()
  ) {
    NotebookActions.insertBelow(notebook);
    NotebookActions.changeCellType(notebook, 'code');
  }
  notebook.activeCell?.model.sharedModel.setSource(code);
  return true;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'transient-nb:plugin',
  description:
    'A side panel listing the transient clusters of this user, live.',
  autoStart: true,
  optional: [ILabShell, ILayoutRestorer, INotebookTracker, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    restorer: ILayoutRestorer | null,
    tracker: INotebookTracker | null,
    palette: ICommandPalette | null
  ) => {
    const { commands, shell } = app;
    const sidebar = new TransientSidebar({
      insertConnect: cluster =>
        void commands.execute(CommandIDs.insertConnect, { name: cluster.name })
    });
    sidebar.title.icon = clusterIcon;
    shell.add(sidebar, 'left', { rank: 210 });
    restorer?.add(sidebar, sidebar.id);

    commands.addCommand(CommandIDs.open, {
      label: 'Show Transient Clusters',
      execute: () => shell.activateById(sidebar.id)
    });
    commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh Transient Clusters',
      execute: () => sidebar.refresh()
    });
    commands.addCommand(CommandIDs.newCluster, {
      label: 'New Transient Cluster…',
      execute: () => sidebar.newCluster()
    });
    commands.addCommand(CommandIDs.insertConnect, {
      label: args =>
        args.name
          ? `Insert Code to Connect to ${args.name}`
          : 'Insert Code to Connect to a Transient Cluster',
      isEnabled: () => sidebar.clusters.some(c => c.status === 'running'),
      execute: async args => {
        const running = sidebar.clusters.filter(c => c.status === 'running');
        const cluster: ICluster | undefined = args.name
          ? sidebar.clusters.find(c => c.name === args.name)
          : running[0];
        if (!cluster) {
          Notification.warning('No running transient cluster to connect to.', {
            autoClose: 5000
          });
          return;
        }
        if (insertIntoNotebook(tracker, cluster.connect_code)) {
          if (labShell && tracker?.currentWidget) {
            labShell.activateById(tracker.currentWidget.id);
          }
          return;
        }
        // No notebook open: the clipboard is the next best place.
        Clipboard.copyToSystem(cluster.connect_code);
        Notification.info(
          `No active notebook: the code to connect to ${cluster.name} is in the clipboard.`,
          { autoClose: 5000 }
        );
      }
    });
    if (palette) {
      const category = 'Transient Clusters';
      for (const command of [
        CommandIDs.open,
        CommandIDs.newCluster,
        CommandIDs.insertConnect,
        CommandIDs.refresh
      ]) {
        palette.addItem({ command, category });
      }
    }
  }
};

export default plugin;
