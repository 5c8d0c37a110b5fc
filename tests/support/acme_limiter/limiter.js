// Retry-After as Let's Encrypt gives it: the moment the limit allows the next order, i.e. when
// nginx's window since the last granted order has passed (limit_req at 1r/m keeps 16 thousandths
// of a request a second: the next order is granted 62.5 s after the last granted one), but never
// less than LEAST_S from now, so the CA's time is always later than the backoff of the test
// site's certbot (tls.acme_retry_s 10 s); in the form of its problem detail ("retry after
// 2025-01-01 00:00:00 UTC") and in seconds (the header, from that same moment).
import fs from 'fs';

const GRANTED = '/tmp/acme-limiter-granted';  // when the last order passed limit_req (ms)
const WINDOW_MS = 62500;
const LEAST_S = 20;

// Evaluated as a granted order is passed on to pebble: notes when.
function granted(r) {
    fs.writeFileSync(GRANTED, String(Date.now()));
    return '';
}

function retry_at(r) {
    const allowed = Math.ceil((Number(fs.readFileSync(GRANTED, 'utf8')) + WINDOW_MS) / 1000);
    const moment = Math.max(allowed, Math.ceil(Date.now() / 1000) + LEAST_S);
    return new Date(moment * 1000).toISOString().slice(0, 19).replace('T', ' ') + ' UTC';
}

function retry_after(r) {
    const moment = Date.parse(r.variables.retry_at.replace(' UTC', 'Z').replace(' ', 'T'));
    return String(Math.max(1, Math.ceil((moment - Date.now()) / 1000)));
}

export default {granted, retry_after, retry_at};
