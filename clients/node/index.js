'use strict';
// pg-idempotency: Idempotency-Key middleware on the idempotency extension.
const { idempotent } = require('./lib/express');
const { idempotentFastify } = require('./lib/fastify');
const { parseKey, Guard, defaultStore } = require('./lib/core');
const { runPhases, PhaseError } = require('./lib/phases');

module.exports = { idempotent, idempotentFastify, parseKey, Guard, defaultStore, runPhases, PhaseError };
