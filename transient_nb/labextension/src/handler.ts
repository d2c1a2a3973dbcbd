import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * The server extension's URL namespace.
 */
export const API_NAMESPACE = 'transient-nb';

/**
 * Call the transient_nb server extension; every HTTP request of the panel goes through here.
 *
 * @param endPoint - path under `/transient-nb/`, with its query string
 * @param init - fetch options (method, JSON body, abort signal)
 * @returns the decoded JSON answer
 * @throws ServerConnection.ResponseError with the server's `message` on a 4xx/5xx answer
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    // Aborted long polls land here too; the caller tells them apart by the signal.
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (a proxy's error page): keep the text for the message.
    }
  }
  if (!response.ok) {
    const message =
      (data && typeof data === 'object' && data.message) || String(data);
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}
