-- Run once by the postgres image's entrypoint (as the owner role).
-- The application role can read and write rows but owns nothing and is no superuser, so the
-- append-only triggers on the ledger cannot be dropped by the application.
CREATE ROLE fairmeter_app LOGIN PASSWORD 'change-me' NOSUPERUSER NOCREATEDB NOCREATEROLE;
GRANT CONNECT ON DATABASE fairmeter TO fairmeter_app;
GRANT USAGE ON SCHEMA public TO fairmeter_app;
ALTER DEFAULT PRIVILEGES FOR ROLE fairmeter_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO fairmeter_app;
ALTER DEFAULT PRIVILEGES FOR ROLE fairmeter_owner IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO fairmeter_app;
