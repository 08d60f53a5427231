// Calls to /v1 with the visitor's token. A 401 asks for a token; any other
// refusal is thrown as an ApiError (status, the sentence, any problems).

import { askToken, token } from "./token.js";

class ApiError extends Error {
  /** `problems`: the answer's `[{field, message}]`, if it lists any. */
  constructor(status, message, problems = []) {
    super(message);
    this.status = status;
    this.problems = problems;
  }
}

export function authHeaders() {
  const given = token();
  return given ? { Authorization: `Bearer ${given}` } : {};
}

/** The answer's JSON (or text: logs) if it is a success. */
export async function api(path, { method = "GET", body } = {}) {
  const headers = authHeaders();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = text;
  try {
    data = JSON.parse(text);
  } catch {
    // Plain text: logs.
  }
  if (response.status === 401) askToken(data?.error);
  if (!response.ok) {
    const problems = Array.isArray(data?.problems) ? data.problems : [];
    throw new ApiError(response.status, data?.error ?? `${response.status} ${response.statusText}`, problems);
  }
  return data;
}
