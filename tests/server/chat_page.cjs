// chat_page.cjs — the chat page of kiln serve in headless Chromium (Debian's /usr/bin/chromium) driven by
// puppeteer-core: types a message, waits for the streamed answer and its timing line, saves a screenshot.
// usage: node chat_page.cjs PORT SCREENSHOT.png USER_DATA_DIR   (tests/test_server.c runs it)
'use strict';
const puppeteer = require('puppeteer-core');

const [port, shot, userDir] = process.argv.slice(2);

async function main() {
  const browser = await puppeteer.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    userDataDir: userDir,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
           '--disable-sync', '--no-first-run', `--user-data-dir=${userDir}`],
    timeout: 60000,
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', e => errors.push(String(e)));
    await page.setViewport({width: 900, height: 640});
    await page.goto(`http://127.0.0.1:${port}/`, {waitUntil: 'load', timeout: 30000});
    await page.waitForFunction(() => document.getElementById('model').textContent.endsWith('.gguf'), {timeout: 10000});
    await page.type('#input', 'Tell me a story about a cat');
    await page.keyboard.press('Enter');
    await page.waitForSelector('.msg.assistant .stats', {timeout: 60000});
    const answer = await page.$eval('.msg.assistant .text', e => e.textContent);
    const stats = await page.$eval('.msg.assistant .stats', e => e.textContent);
    const error = await page.$eval('.msg.assistant', e => (e.querySelector('.error') || {}).textContent || '');
    const user = await page.$eval('.msg.user', e => e.textContent);
    await page.screenshot({path: shot});
    console.log(JSON.stringify({answer, stats, error, user, errors}));
    if (error || errors.length || user !== 'Tell me a story about a cat') process.exit(1);
  } finally {
    await browser.close();
  }
}

main().catch(e => { console.error('error: ' + (e && e.stack || e)); process.exit(2); });
