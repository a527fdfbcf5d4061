-- The application's database role: it reads and writes rows, owns nothing, is no superuser,
-- and has no TRUNCATE, TRIGGER or REFERENCES privilege. So it cannot drop, disable or bypass
-- the append-only triggers of the ledger, the decisions, the Stripe deliveries and the audit
-- log (ALTER TABLE and DROP TRIGGER need the owner; session_replication_role needs a
-- superuser), and every UPDATE or DELETE of those rows is refused by the triggers.
--
-- docker-compose runs this once, as the owner role, when the database is first created (the
-- postgres image's /docker-entrypoint-initdb.d), before the `migrate` service creates the tables
-- as that same owner. Elsewhere, run it with psql as the owner, before or after migrating
-- (it is idempotent):
--
--   FAIRMETER_APP_DB_PASSWORD=... psql "postgresql://fairmeter_owner@host/fairmeter" \
--       -f docs/deploy/init-app-role.sql
--
-- Override the role names with `-v app_role=... -v owner_role=...` (tests/security does).

\set ON_ERROR_STOP on
\if :{?app_role}
\else
  \set app_role fairmeter_app
\endif
\if :{?owner_role}
\else
  \set owner_role fairmeter_owner
\endif
\getenv app_password FAIRMETER_APP_DB_PASSWORD
\if :{?app_password}
\else
  \set app_password change-me
\endif

SELECT format(
    'CREATE ROLE %I LOGIN PASSWORD %L NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION '
    'NOBYPASSRLS', :'app_role', :'app_password')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app_role') \gexec

SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'app_role') \gexec
-- Nobody but the owner creates objects in the schema (PostgreSQL < 15 lets PUBLIC do so).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"app_role";

-- Row privileges only, on the tables that exist now and on those the owner creates later.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"app_role";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO :"app_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"app_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO :"app_role";
