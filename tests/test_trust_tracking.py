

def test_a_lost_migration_race_is_recognised(tmp_path: Path) -> None:
    """The errors another opener's migration leaves are "already exists"-class (retried once);
    any other error is not."""
    import sqlalchemy

    from stability.tracking.uri import already_exists

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE t (a INTEGER)"))
    errors = []
    for sql in ("CREATE TABLE t (a INTEGER)", "ALTER TABLE t ADD COLUMN a INTEGER",
                "SELECT * FROM missing"):
        try:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text(sql))
        except sqlalchemy.exc.OperationalError as err:
            errors.append(err)
    assert [already_exists(e) for e in errors] == [True, True, False]
