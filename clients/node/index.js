'use strict';
// pg-idempotency: Idempotency-Key middleware on the idempotency extension.
const { idempotent, idempotentPhases } = require('./lib/express');
const { idempotentFastify, idempotentPhasesFastify } = require('./lib/fastify');
const { parseKey, Guard, defaultStore } = require('./lib/core');
const { runPhases, PhaseError } = require('./lib/phases');
const { relay, webhook, Relay } = require('./lib/relay');
const { VERSION, EXTENSION_MIN, ExtensionVersionError } = require('./lib/compat');

module.exports = { idempotent, idempotentFastify, idempotentPhases, idempotentPhasesFastify, parseKey, Guard, defaultStore, runPhases, PhaseError, relay, webhook, Relay, VERSION, EXTENSION_MIN, ExtensionVersionError };
