//! htpasswd files: `user:hash` lines, bcrypt and argon2 hashes only, read at load and again when the file changes.

/// The users of an htpasswd file's text (`file` names it in messages), and why lines were
/// refused (each message names the file and line). Blank lines and `#` comments are skipped.
pub fn parse(text: &str, file: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut users: Vec<(String, String)> = Vec::new();
    let mut errors = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let where_ = format!("{file}:{}", n + 1);
        let Some((user, hash)) = line.split_once(':') else {
            errors.push(format!("{where_}: expected user:hash"));
            continue;
        };
        match hash_error(hash) {
            Some(m) => errors.push(format!("{where_}: user {user:?}: {m}")),
            None => set_user(&mut users, user, hash),
        }
    }
    (users, errors)
}

/// The users of an htpasswd file merged with a table's (the table's win), sorted by user.
pub fn merge(file: Vec<(String, String)>, table: &[(String, String)]) -> Vec<(String, String)> {
    let mut users = file;
    for (u, h) in table {
        set_user(&mut users, u, h);
    }
    users.sort();
    users
}

pub(crate) fn set_user(users: &mut Vec<(String, String)>, user: &str, hash: &str) {
    users.retain(|(u, _)| u != user);
    users.push((user.to_string(), hash.to_string()));
}

/// Why a password hash is refused: only bcrypt (`$2a$`, `$2b$`, `$2y$`) and argon2
/// (`$argon2id$`, `$argon2i$`, `$argon2d$`) are taken.
pub fn hash_error(hash: &str) -> Option<String> {
    let bcrypt = ["$2a$", "$2b$", "$2x$", "$2y$"]
        .iter()
        .any(|p| hash.starts_with(p));
    let argon2 = ["$argon2id$", "$argon2i$", "$argon2d$"]
        .iter()
        .any(|p| hash.starts_with(p));
    if bcrypt {
        // $2y$NN$ + 53 characters of salt and hash
        let ok = hash.len() == 60 && hash[4..6].bytes().all(|b| b.is_ascii_digit());
        return (!ok)
            .then(|| "a malformed bcrypt hash (expected 60 characters, $2y$NN$...)".to_string());
    }
    if argon2 {
        return None;
    }
    let what = if hash.starts_with("{SHA}") {
        "a SHA-1 hash"
    } else if hash.starts_with("$apr1$") || hash.starts_with("$1$") {
        "an MD5 hash"
    } else if hash.starts_with("$5$") || hash.starts_with("$6$") {
        "a SHA-crypt hash"
    } else {
        "not a password hash (plain text or crypt)"
    };
    Some(format!(
        "{what} is refused: use bcrypt (`htpasswd -B`) or argon2 (`argon2 SALT -id -e`)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: &str = "$2y$05$abcdefghijklmnopqrstuuJq0f0p5rQyW5p6Y1ZqS5aK0O2b3c4d6";

    #[test]
    fn lines_are_users_and_refusals_name_the_line() {
        let text = format!("# admins\nalice:{B}\n\nbob:{{SHA}}abc\ncarol\n");
        let (users, errors) = parse(&text, "users.htpasswd");
        assert_eq!(users, vec![("alice".to_string(), B.to_string())]);
        assert_eq!(errors.len(), 2);
        assert!(errors[0].starts_with("users.htpasswd:4: user \"bob\": a SHA-1 hash"));
        assert!(errors[1].starts_with("users.htpasswd:5: expected user:hash"));
    }

    #[test]
    fn the_table_wins_over_the_file() {
        let file = vec![("a".into(), "1".into()), ("b".into(), "2".into())];
        let merged = merge(file, &[("a".into(), "9".into())]);
        assert_eq!(
            merged,
            vec![("a".into(), "9".into()), ("b".into(), "2".into())]
        );
    }
}
