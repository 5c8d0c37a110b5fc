// The moment of Retry-After (63 s: the limit refills within 62.5 s) in the form Let's Encrypt's
// problem detail gives it ("retry after 2025-01-01 00:00:00 UTC").
function retry_at(r) {
    return new Date(Date.now() + 63000).toISOString().slice(0, 19).replace('T', ' ') + ' UTC';
}

export default {retry_at};
