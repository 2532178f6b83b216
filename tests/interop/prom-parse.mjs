// Reads Prometheus text exposition on stdin and prints what parse-prometheus-text-format (a parser
// nobody here wrote) makes of it, as JSON: [{name, help, type, metrics: [{value, labels}]}].
// Exits 1 when the text does not parse.
import parse from 'parse-prometheus-text-format';

let text = '';
process.stdin.setEncoding('utf8');
for await (const chunk of process.stdin) text += chunk;
try {
  process.stdout.write(JSON.stringify(parse(text)) + '\n');
} catch (error) {
  process.stderr.write(`not Prometheus text: ${error.message}\n`);
  process.exit(1);
}
