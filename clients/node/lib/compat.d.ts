// compat.d.ts: the types of compat.js.
import type { Pool, PoolClient } from 'pg';

/** This package's version (package.json). */
export declare const VERSION: string;
/** The oldest idempotency extension this package works with (its own major.minor, .0). */
export declare const EXTENSION_MIN: string;
/** Thrown (a guarded request answers 500) when the database's extension is older than EXTENSION_MIN, or missing. */
export declare class ExtensionVersionError extends Error {
	/** The database's extension version, or null when it is not installed. */
	readonly found: string | null;
	/** EXTENSION_MIN. */
	readonly needed: string;
}
/** Resolves to the extension's version; one query per pool, on its first use. */
export declare function checkExtension(pool: Pool, via?: Pool | PoolClient): Promise<string>;
/** How many version queries this process has sent (one per pool). */
export declare function versionQueries(): number;
