// Loads a compare report in headless Chromium through the DevTools protocol (over
// --remote-debugging-pipe, so nothing but node itself is needed), with the viewport set as
// DevTools' device emulation sets it: 1400 px for a desktop, 420 px (mobile) for a phone.
// Headless Chromium's window cannot be narrower than 500 px, so a --window-size would not test a
// phone. At each width it checks what a reader would: the page holds the 5 charts, the 2 tables
// and the verdict, nothing outside the file was requested, no script error or failed resource,
// the page does not scroll horizontally, and at 1400 px neither table scrolls inside its box;
// then it saves a full-page screenshot.
// Usage: node report_layout.js CHROMIUM REPORT_HTML SCREENSHOT_DIR
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const [browser, report, shotDir] = process.argv.slice(2);
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ptrain-chromium-'));
const chrome = spawn(browser, ['--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars', '--no-first-run',
                               '--remote-debugging-pipe', `--user-data-dir=${profile}`, 'about:blank'],
                     { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
let stderr = '';
chrome.stderr.on('data', (d) => { stderr += d; });
chrome.stdio[4].setEncoding('utf8');  // a character split across chunks stays whole
// Chromium gone (or never started): every pending command fails instead of waiting forever.
const gone = (why) => { for (const { reject } of pending.values()) reject(new Error(why)); pending.clear(); };
chrome.on('error', (e) => gone(`${browser} could not start: ${e.message}`));
chrome.on('exit', (code) => gone(`Chromium exited (code ${code})\n${stderr}`));
chrome.stdio[3].on('error', () => {});  // a write after Chromium exited: reported through gone()

// The protocol: JSON messages separated by NUL, commands on the child's fd 3, replies on fd 4.
let nextId = 1, buffered = '';
const pending = new Map(), listeners = [];
chrome.stdio[4].on('data', (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf('\0')) >= 0) {
    const message = JSON.parse(buffered.slice(0, end));
    buffered = buffered.slice(end + 1);
    if (message.id && pending.has(message.id)) {
      const { resolve, reject, method } = pending.get(message.id);
      pending.delete(message.id);
      if (message.error) reject(new Error(`${method}: ${message.error.message}`));
      else resolve(message.result);
    } else if (message.method) {
      for (const listen of listeners) listen(message);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  chrome.stdio[3].write(JSON.stringify({ id, method, params, sessionId }) + '\0');
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject, method }));
}
function once(method, sessionId) {
  return new Promise((resolve) => {
    const listen = (m) => {
      if (m.method === method && m.sessionId === sessionId) {
        listeners.splice(listeners.indexOf(listen), 1);
        resolve(m.params);
      }
    };
    listeners.push(listen);
  });
}

const problems = [];
async function check(width) {
  const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
  const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
  const s = (method, params) => send(method, params, sessionId);
  listeners.push((m) => {
    if (m.sessionId !== sessionId) return;
    if (m.method === 'Runtime.exceptionThrown') problems.push(`${width} px: script error ${m.params.exceptionDetails.text}`);
    if (m.method === 'Network.requestWillBeSent' && !m.params.request.url.startsWith('file://') &&
        !m.params.request.url.startsWith('data:'))
      problems.push(`${width} px: the report requested ${m.params.request.url}`);
    if (m.method === 'Network.loadingFailed') problems.push(`${width} px: a resource failed to load (${m.params.errorText})`);
  });
  await Promise.all([s('Page.enable'), s('Runtime.enable'), s('Network.enable')]);
  const mobile = width < 600;
  await s('Emulation.setDeviceMetricsOverride', { width, height: 900, deviceScaleFactor: 1, mobile });
  const loaded = once('Page.loadEventFired', sessionId);
  await s('Page.navigate', { url: 'file://' + path.resolve(report) });
  await loaded;
  const { result } = await s('Runtime.evaluate', {
    returnByValue: true,
    expression: `({
      pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
      height: document.documentElement.scrollHeight,
      charts: document.querySelectorAll('figure svg').length, tables: document.querySelectorAll('table').length,
      verdict: (document.querySelector('.verdict') || {}).textContent || '',
      bf16: document.querySelectorAll('svg [data-mode="bf16"]').length,
      tableBoxes: Array.from(document.querySelectorAll('.table-wrap')).map((w) => [w.scrollWidth, w.clientWidth]),
    })`,
  });
  const r = result.value;
  const fail = (what) => problems.push(`${width} px: ${what}`);
  if (r.viewport !== width) fail(`the viewport is ${r.viewport} px, not ${width}`);
  if (r.charts !== 5) fail(`${r.charts} charts, expected 5`);
  if (r.tables !== 2) fail(`${r.tables} tables, expected 2`);
  if (!r.verdict.startsWith('Verdict.')) fail('no verdict paragraph');
  if (r.bf16 === 0) fail('the charts have no bf16 curve');
  if (r.pageWidth > r.viewport) fail(`the page is ${r.pageWidth} px wide: it scrolls horizontally`);
  if (width >= 1400)
    r.tableBoxes.forEach(([content, box], i) => {
      if (content > box) fail(`table ${i + 1} is ${content} px in a ${box} px box: it scrolls horizontally`);
    });
  // The whole page in one image: the viewport made as tall as the page.
  await s('Emulation.setDeviceMetricsOverride', { width, height: r.height, deviceScaleFactor: 1, mobile });
  const shot = await s('Page.captureScreenshot', { format: 'png' });
  const file = path.join(shotDir, `report-${width}px.png`);
  fs.writeFileSync(file, Buffer.from(shot.data, 'base64'));
  const boxes = r.tableBoxes.map(([content, box]) => `${content}/${box}`).join(' ');
  console.log(`${width} px: page ${r.pageWidth}/${r.viewport} px wide, ${r.height} px tall, tables (content/box px) ` +
              `${boxes}, screenshot ${file} ${fs.statSync(file).size} bytes`);
  await send('Target.closeTarget', { targetId });
}

(async () => {
  const timer = setTimeout(() => {
    console.log('FAIL: Chromium did not answer within 60 s\n' + stderr);
    chrome.kill();
    fs.rmSync(profile, { recursive: true, force: true });
    process.exit(1);
  }, 60000);
  try {
    const { product } = await send('Browser.getVersion');
    await check(1400);
    await check(420);
    console.log(`rendered in ${product}`);
  } catch (e) {
    problems.push(`${e.message}\n${stderr}`);
  }
  clearTimeout(timer);
  // The profile is removed once Chromium has exited: it writes there until then.
  const exited = new Promise((resolve) => chrome.once('exit', resolve));
  send('Browser.close').catch(() => {});
  await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 10000))]);
  chrome.kill();
  fs.rmSync(profile, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
  for (const p of problems) console.log('FAIL: ' + p);
  process.exit(problems.length ? 1 : 0);
})();
