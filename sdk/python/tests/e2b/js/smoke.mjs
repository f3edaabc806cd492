// E2B's JS SDK against a Warren node: create, run, files, list, kill. The node is named by
// E2B_API_URL / E2B_SANDBOX_URL / E2B_DOMAIN / E2B_API_KEY (set by test_e2b_js.py).
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const run = `js-${process.pid}`
const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { run } })
try {
  const r = await sbx.commands.run('echo hello from $0; echo oops >&2', { envs: { X: '1' } })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello from /bin/bash\n')
  assert.equal(r.stderr, 'oops\n')
  await sbx.files.write('/tmp/js.txt', 'written by node')
  assert.equal(await sbx.files.read('/tmp/js.txt'), 'written by node')
  const listed = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
} finally {
  await sbx.kill()
}
const left = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
assert.equal(left.length, 0)
console.log(JSON.stringify({ ok: true, sandbox: sbx.sandboxId }))
